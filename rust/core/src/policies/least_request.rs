//! `least-request`: filter out endpoints whose engine queue has `maxWaitingRequests` or
//! more waiting requests (Kthena's default 10), and score by estimated load
//! ([`crate::scorer::Signals::load`]: engine running + waiting, corrected by the router's
//! own in-flight change since the last scrape). Stale endpoints are filtered out and
//! score 0 (unknown load is worst-case load).

use super::{inverse_norm, ArgSpec, Args, Ctx, Policy, PolicyInfo, Value};

const MAX_WAITING: ArgSpec =
    ArgSpec::int("maxWaitingRequests", "max_waiting_requests", Value::Int(10)).positive();

pub const INFO: PolicyInfo = PolicyInfo {
    filter: true,
    args: &[MAX_WAITING],
    ..PolicyInfo::score("least-request", build)
};

fn build(args: &Args) -> Result<Box<dyn Policy>, String> {
    let max_waiting = args.value(&MAX_WAITING).unwrap_or(10.0);
    Ok(Box::new(LeastRequest { max_waiting }))
}

pub struct LeastRequest {
    max_waiting: f64,
}

impl Policy for LeastRequest {
    fn name(&self) -> &'static str {
        "least-request"
    }

    fn filter(&self, ctx: &Ctx, cands: &mut Vec<u32>) {
        // NaN waiting (never scraped) fails the comparison: filtered like stale.
        cands.retain(|&s| {
            let e = &ctx.eps[s as usize];
            !e.stale && e.waiting < self.max_waiting
        });
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        inverse_norm(|s| ctx.load[s as usize], cands, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn filter_by_waiting_and_staleness() {
        let mut eps: Vec<_> = (0..4).map(sig).collect();
        eps[0].waiting = 3.0;
        eps[1].waiting = 2.0;
        eps[2].stale = true;
        eps[3].waiting = f64::NAN;
        let p = make("least-request", &[("maxWaitingRequests", 3.0)]);
        assert_eq!(filter(&*p, &eps, None), vec![1]);
    }

    #[test]
    fn score_prefers_less_load_and_in_flight_counts() {
        let mut eps: Vec<_> = (0..4).map(sig).collect();
        eps[0].running = 4.0;
        eps[1].running = 2.0;
        eps[1].waiting = 2.0;
        eps[1].in_flight = 3; // three dispatched since the scrape (snapshot 0)
        eps[2].stale = true; // unknown: never idle
        let p = make("least-request", &[]);
        let s = run(&*p, &eps, &[], None, 0);
        // The busiest known endpoint still beats the unknown one.
        assert_eq!(
            s,
            [
                super::super::known(3.0 / 7.0),
                super::super::KNOWN_FLOOR,
                0.0,
                1.0
            ]
        );
    }

    #[test]
    fn bad_argument_rejected() {
        let args = super::Args(vec![("maxWaitingRequests".into(), -1.0)]);
        assert!(super::super::build("least-request", &args).is_err());
    }
}
