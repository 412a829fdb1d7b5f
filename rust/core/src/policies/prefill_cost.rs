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
//! * `pending(e)`: the uncached blocks of the requests the router dispatched to `e` whose
//!   first token has not arrived ([`crate::scorer::Scorer::add_pending`]): counted, not
//!   estimated, so no time constant feeds back from the TTFTs it shapes (a non-streamed
//!   request's work is released at its end). A miss queued on the holder of a prefix is what delays a
//!   cache hit there (a vLLM-style engine prefills the queued hits' few new tokens in one
//!   step, but a cold prompt takes its whole share of the step's token budget); decoding
//!   requests are not counted, pair the plugin with least-request for them.
//!
//! The cost is in prompt blocks, not seconds: engines of one ModelServer share hardware,
//! so the prefill rate cancels out of the comparison (heterogeneous engines are not
//! modelled). Misses raise the pending work where they go, so they spread (negative
//! feedback); a hit stays on its holder unless a cold prefill elsewhere is cheaper than
//! the misses already being prefilled there, which replicates a hot prefix only when its
//! holder is busy with cold work. Scores are `(scale - cost) / scale`, where `scale` is
//! the larger of the candidates' highest cost and this request's whole prompt: a few
//! blocks of difference then weigh what they are worth against one prompt, instead of
//! spreading the scores as widely as a long prefill would (which overrode prefix and
//! adapter affinity on fully cached traffic). A stale endpoint scores 0 (unknown is worst).

use super::{inverse_norm_one, max_known, Ctx, Policy, PolicyInfo};

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
            e.pending_blocks + own
        };
        let scale = max_known(cost, cands).max(ctx.total_blocks);
        for (o, &s) in out.iter_mut().zip(cands) {
            *o = inverse_norm_one(cost(s), scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{known, KNOWN_FLOOR};

    #[test]
    fn cost_is_pending_work_plus_own_uncached_blocks() {
        let p = make("prefill-cost", &[]);
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        // Engine 0 holds 90% of a 100-block prompt; idle engines: affinity.
        let frac = [0.9, 0.0, 0.0];
        let s = run_total(&*p, &eps, &frac, 100.0); // 10 vs 100
        assert_eq!(s, [known(0.9), KNOWN_FLOOR, KNOWN_FLOOR]);
        // 40 blocks of cold work in progress on the holder: 50 vs 100, still the holder.
        eps[0].pending_blocks = 40.0;
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
        // Fully cached everywhere: a few pending blocks weigh against the whole prompt.
        eps[0].pending_blocks = 2.0;
        let s = run_total(&*p, &eps, &[1.0, 1.0, 1.0], 100.0);
        assert_eq!(s, [known(0.98), 1.0, 1.0]);
        eps[0].pending_blocks = 0.0;
        // Stale is worst.
        eps[1].stale = true;
        let s = run_total(&*p, &eps, &[0.0, 1.0, 0.0], 10.0);
        assert!(s[0] > 0.0 && s[1] == 0.0, "{s:?}");
    }

    #[test]
    fn pending_work_is_added_released_and_cleared() {
        let mut sc = crate::scorer::Scorer::new(&Default::default()).unwrap();
        sc.add_endpoint(7);
        let pending = |sc: &crate::scorer::Scorer| sc.signals(7).unwrap().pending_blocks;
        sc.add_pending(7, 30.0);
        sc.add_pending(7, 10.0);
        assert_eq!(pending(&sc), 40.0);
        sc.add_pending(7, -30.0); // the first request's first token
        assert_eq!(pending(&sc), 10.0);
        sc.add_pending(7, f64::NAN); // ignored
        sc.add_pending(7, -25.0); // never below zero
        assert_eq!(pending(&sc), 0.0);
        // the router's last request there finished: nothing of ours is pending
        sc.add_pending(7, 5.0);
        sc.add_in_flight(7, 1);
        assert_eq!(pending(&sc), 5.0);
        sc.add_in_flight(7, -1);
        assert_eq!(pending(&sc), 0.0);
    }
}
