//! `least-latency`: TTFT and TPOT each normalised over the candidates, blended as
//! `f * ttft_score + (1 - f) * tpot_score` with `f = TTFTTPOTWeightFactor` (default 0.5).
//! Stale endpoints and missing samples count as the worst latency (score 0).

use super::{inverse_norm_one, max_known, ArgSpec, Args, Ctx, Policy, PolicyInfo};

/// 1 = TTFT only, 0 = TPOT only.
const FACTOR: ArgSpec =
    ArgSpec::float("TTFTTPOTWeightFactor", "ttft_tpot_weight_factor", 0.5).range(0.0, 1.0);

pub const INFO: PolicyInfo = PolicyInfo {
    args: &[FACTOR],
    ..PolicyInfo::score("least-latency", build)
};

fn build(args: &Args) -> Result<Box<dyn Policy>, String> {
    let f = args.value(&FACTOR).unwrap_or(0.5);
    Ok(Box::new(LeastLatency { f }))
}

pub struct LeastLatency {
    f: f64,
}

impl Policy for LeastLatency {
    fn name(&self) -> &'static str {
        "least-latency"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let cost = |s: u32, tpot: bool| {
            let e = &ctx.eps[s as usize];
            let v = if tpot { e.tpot_s } else { e.ttft_s };
            if e.stale || v.is_nan() {
                f64::INFINITY
            } else {
                v
            }
        };
        let max_ttft = max_known(|s| cost(s, false), cands);
        let max_tpot = max_known(|s| cost(s, true), cands);
        for (o, &s) in out.iter_mut().zip(cands) {
            let ttft = inverse_norm_one(cost(s, false), max_ttft);
            let tpot = inverse_norm_one(cost(s, true), max_tpot);
            *o = self.f * ttft + (1.0 - self.f) * tpot;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{known, KNOWN_FLOOR as F};

    #[test]
    fn blend_and_unknowns() {
        let mut eps: Vec<_> = (0..4).map(sig).collect();
        for (e, (ttft, tpot)) in
            eps.iter_mut()
                .zip([(1.0, 0.02), (0.5, 0.04), (0.1, 0.01), (f64::NAN, 0.01)])
        {
            e.ttft_s = ttft;
            e.tpot_s = tpot;
        }
        let ttft_only = run(
            &*make("least-latency", &[("TTFTTPOTWeightFactor", 1.0)]),
            &eps,
            &[],
            None,
            0,
        );
        assert_eq!(ttft_only, [F, known(0.5), known(0.9), 0.0]);
        let tpot_only = run(
            &*make("least-latency", &[("TTFTTPOTWeightFactor", 0.0)]),
            &eps,
            &[],
            None,
            0,
        );
        assert_eq!(tpot_only, [known(0.5), F, known(0.75), known(0.75)]);
        let half = run(&*make("least-latency", &[]), &eps, &[], None, 0);
        for i in 0..4 {
            assert!((half[i] - (ttft_only[i] + tpot_only[i]) / 2.0).abs() < 1e-12);
        }
        eps[2].stale = true;
        assert_eq!(
            run(&*make("least-latency", &[]), &eps, &[], None, 0)[2],
            0.0
        );
        let bad = super::Args(vec![("TTFTTPOTWeightFactor".into(), 2.0)]);
        assert!(super::super::build("least-latency", &bad).is_err());
    }
}
