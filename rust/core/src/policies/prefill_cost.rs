//! `prefill-cost` (ours): a cost-based placement score. Each candidate's cost is the
//! prefill work, in the prefix index's blocks, this request would find in progress on the
//! engine plus its own:
//!
//! ```text
//! cost(e) = pending(e) + total * (1 - prefix(e))
//! ```
//!
//! * `total * (1 - prefix(e))`: this request's uncached blocks on `e` (its prompt minus the
//!   prefix `e` holds, from the same match prefix-cache / kvcache-aware score);
//! * `pending(e)`: the uncached blocks of the requests the router dispatched to `e`
//!   ([`crate::scorer::Scorer::observe_dispatch`]), decayed with the engine's mean TTFT
//!   (scraped and observed by the router) as time constant
//!   ([`crate::scorer::Signals::pending_blocks_at`]): work dispatched about one TTFT ago
//!   has mostly been prefilled; none is pending once the router has no request left in
//!   flight there. A miss queued on the holder of a prefix is what delays a
//!   cache hit there (a vLLM-style engine prefills the queued hits' few new tokens in one
//!   step, but a cold prompt takes its whole share of the step's token budget); decoding
//!   requests are not counted, pair the plugin with least-request for them.
//!
//! The cost is in prompt blocks, not seconds: engines of one ModelServer share hardware,
//! so the prefill rate cancels out of the comparison (heterogeneous engines are not
//! modelled). Misses raise the pending work where they go, so they spread (negative
//! feedback); a hit stays on its holder unless a cold prefill elsewhere is cheaper than
//! the misses already being prefilled there, which replicates a hot prefix only when its
//! holder is busy with cold work. Scores are `(max - cost) / max` over the candidates; a
//! stale endpoint scores 0 (unknown is worst).

use super::{inverse_norm, Ctx, Policy, PolicyInfo};

pub const INFO: PolicyInfo = PolicyInfo {
    affinity: true,
    prefix_input: true,
    ..PolicyInfo::score("prefill-cost", build)
};

fn build(_: &super::Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefillCost))
}

pub struct PrefillCost;

impl Policy for PrefillCost {
    fn name(&self) -> &'static str {
        "prefill-cost"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let cost = |s: u32| {
            let e = &ctx.eps[s as usize];
            if e.stale {
                return f64::INFINITY;
            }
            let own = ctx.total_blocks * (1.0 - ctx.prefix[s as usize].clamp(0.0, 1.0));
            e.pending_blocks_at(ctx.now) + own
        };
        inverse_norm(cost, cands, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{known, KNOWN_FLOOR};
    use crate::scorer::Signals;

    fn pending(e: &mut Signals, blocks: f64, at: f64, ttft: f64) {
        e.pending_blocks = blocks;
        e.pending_at = at;
        e.ttft_s = ttft;
    }

    #[test]
    fn cost_is_pending_work_plus_own_uncached_blocks() {
        let p = make("prefill-cost", &[]);
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        // Engine 0 holds 90% of a 100-block prompt; idle engines: affinity.
        let frac = [0.9, 0.0, 0.0];
        let s = run_total(&*p, &eps, &frac, 100.0); // 10 vs 100
        assert_eq!(s, [known(0.9), KNOWN_FLOOR, KNOWN_FLOOR]);
        // 40 blocks of cold work in progress on the holder: 50 vs 100, still the holder.
        pending(&mut eps[0], 40.0, 0.0, 0.5);
        let s = run_total(&*p, &eps, &frac, 100.0);
        assert_eq!(s, [known(0.5), KNOWN_FLOOR, KNOWN_FLOOR]);
        // 120 blocks: one cold prefill elsewhere is cheaper (replication).
        eps[0].pending_blocks = 120.0;
        let s = run_total(&*p, &eps, &frac, 100.0);
        assert!(s[1] > s[0] && s[1] == s[2], "{s:?}");
        // Decoding requests are not prefill work: running does not enter the cost.
        eps[0].pending_blocks = 0.0;
        eps[0].running = 50.0;
        assert_eq!(run_total(&*p, &eps, &frac, 100.0)[0], known(0.9));
    }

    #[test]
    fn pending_work_decays_with_the_ttft_and_stale_is_worst() {
        let mut e = sig(0);
        pending(&mut e, 100.0, 1.0, 0.5);
        assert_eq!(e.pending_blocks_at(1.0), 100.0);
        assert!((e.pending_blocks_at(1.5) - 100.0 / std::f64::consts::E).abs() < 1e-9);
        e.ttft_s = f64::NAN; // no TTFT sample yet: kept as is
        assert_eq!(e.pending_blocks_at(10.0), 100.0);
        let p = make("prefill-cost", &[]);
        let mut eps: Vec<_> = (0..2).map(sig).collect();
        eps[1].stale = true;
        let s = run_total(&*p, &eps, &[0.0, 1.0], 10.0);
        assert!(s[0] > 0.0 && s[1] == 0.0, "{s:?}");
    }

    #[test]
    fn dispatches_accumulate_and_decay() {
        let mut sc = crate::scorer::Scorer::new(&Default::default()).unwrap();
        sc.add_endpoint(7);
        sc.observe_dispatch_at(7, 30.0, 2.0);
        sc.observe_dispatch_at(7, 10.0, 2.0);
        assert_eq!(sc.signals(7).unwrap().pending_blocks_at(2.0), 40.0);
        sc.observe_latency(7, 1.0, f64::NAN);
        sc.observe_dispatch_at(7, 5.0, 3.0); // 40 / e + 5
        let got = sc.signals(7).unwrap().pending_blocks_at(3.0);
        assert!(
            (got - (40.0 / std::f64::consts::E + 5.0)).abs() < 1e-9,
            "{got}"
        );
        sc.observe_dispatch_at(7, f64::NAN, 3.0); // ignored
        assert_eq!(sc.signals(7).unwrap().pending_blocks_at(3.0), got);
        // the router's last request there finished: nothing of ours is pending
        sc.add_in_flight(7, 1);
        assert_eq!(sc.signals(7).unwrap().pending_blocks_at(3.0), got);
        sc.add_in_flight(7, -1);
        assert_eq!(sc.signals(7).unwrap().pending_blocks_at(3.0), 0.0);
    }
}
