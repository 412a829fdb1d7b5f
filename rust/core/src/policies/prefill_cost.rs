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
//!
//! `copyCost` (ours) adds the price of the prefix copy a move makes:
//! `copyCost * kv(e) * total * (held - prefix(e))`, where `held` is the largest prefix any
//! candidate holds and `kv(e)` the engine's KV usage. Without it a hit leaves its holder as
//! soon as one cold prefill elsewhere is cheaper than the holder's queue, which on a KV-bound
//! engine costs more than that request's TTFT (docs/hard-workloads-copy-cost.md).
//!
//! `realizedPrefix` (ours) scales each engine's `prefix(e)` by its hit realization: the
//! share of the hits the index credited it with that the engine reports serving
//! ([`crate::scorer::Signals::hit_realization`]). The index cannot see an engine evict what
//! its running requests crowd out; without this, such an engine keeps the sessions it is
//! evicting (both its own cost and the copy a move would make are priced as if it held them).

use super::{inverse_norm_one, max_known, ArgSpec, Args, Ctx, Policy, PolicyInfo};

/// Ours: the price of the prefix copy a move creates, per block the request would prefill
/// here that another candidate holds, scaled by this engine's KV usage. A copy on an
/// engine whose cache is full takes the place of as many blocks of other work (a running
/// request's, or a cached prefix's that will be prefilled again), which the request's own
/// TTFT does not pay; on an engine with room it costs nothing. 0 = off (the cost before it).
const COPY: ArgSpec = ArgSpec::float("copyCost", "copy_cost", 1.0)
    .range(0.0, 4.0)
    .ours();

/// Ours: scale each engine's credited prefix by its measured hit realization (1 where the
/// engine reports no prefix-cache counters). Off by default: it also reads the lag between
/// a dispatch and its prefill as eviction (docs/hard-workloads-realized-prefix.md).
const REALIZED: ArgSpec = ArgSpec::bool("realizedPrefix", "realized_prefix", false).ours();

pub const INFO: PolicyInfo = PolicyInfo {
    affinity: true,
    prefix_input: true,
    args: &[COPY, REALIZED],
    ..PolicyInfo::score("prefill-cost", build)
};

fn build(args: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefillCost {
        copy: args.value(&COPY).unwrap_or(1.0),
        realized: args.value(&REALIZED).unwrap_or(0.0) != 0.0,
    }))
}

pub struct PrefillCost {
    copy: f64,
    realized: bool,
}

impl Policy for PrefillCost {
    fn name(&self) -> &'static str {
        "prefill-cost"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let frac = |s: u32| {
            let f = ctx.prefix[s as usize].clamp(0.0, 1.0);
            if self.realized {
                f * ctx.eps[s as usize].hit_realization
            } else {
                f
            }
        };
        let held = if self.copy > 0.0 {
            cands.iter().map(|&s| frac(s)).fold(0.0, f64::max)
        } else {
            0.0
        };
        let cost = |s: u32| {
            let e = &ctx.eps[s as usize];
            if e.stale {
                return f64::INFINITY;
            }
            let own = ctx.total_blocks * (1.0 - frac(s));
            // unknown usage counts as full (unknown is worst)
            let kv = if e.kv_usage.is_nan() { 1.0 } else { e.kv_usage.clamp(0.0, 1.0) };
            let copy = self.copy * kv * ctx.total_blocks * (held - frac(s)).max(0.0);
            e.pending_blocks + own + copy
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
    fn copy_cost_prices_a_move_by_the_target_kv_usage() {
        let p = make("prefill-cost", &[]); // copyCost 1
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        let frac = [0.9, 0.0, 0.0];
        // 120 blocks of cold work on the holder: a move pays 100, plus its copy of the
        // 90 held blocks times the target's KV usage.
        eps[0].pending_blocks = 120.0;
        let s = run_total(&*p, &eps, &frac, 100.0); // 130 vs 100 vs 100: room, move
        assert!(s[1] > s[0] && s[1] == s[2], "{s:?}");
        eps[1].kv_usage = 1.0;
        eps[2].kv_usage = 0.5;
        let s = run_total(&*p, &eps, &frac, 100.0); // 130 vs 190 vs 145: stay
        assert!(s[0] > s[2] && s[2] > s[1], "{s:?}");
        eps[2].kv_usage = f64::NAN; // unknown usage: full
        let s = run_total(&*p, &eps, &frac, 100.0);
        assert_eq!(s[1], s[2], "{s:?}");
        // Nothing held anywhere: no copy to price, the cost is as without the argument.
        let off = make("prefill-cost", &[("copyCost", 0.0)]);
        let cold = [0.0, 0.0, 0.0];
        assert_eq!(run_total(&*p, &eps, &cold, 100.0), run_total(&*off, &eps, &cold, 100.0));
    }

    #[test]
    fn realized_prefix_discounts_what_the_engine_evicted() {
        let on = make("prefill-cost", &[("realizedPrefix", 1.0)]);
        let off = make("prefill-cost", &[]); // the default
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        for e in &mut eps {
            e.kv_usage = 0.8;
        }
        let frac = [0.9, 0.0, 0.0];
        // Measured as credited: the argument changes nothing.
        assert_eq!(run_total(&*on, &eps, &frac, 100.0), run_total(&*off, &eps, &frac, 100.0));
        // The holder serves half its credited hits and has 60 blocks of cold work queued:
        // credited, staying costs 70 against a move's 100 + 0.8 * 90; realized, 115 against
        // 100 + 0.8 * 45 (the target copies less than the index credits), so it stays
        // either way, but by far less.
        eps[0].pending_blocks = 60.0;
        eps[0].hit_realization = 0.5;
        let s_off = run_total(&*off, &eps, &frac, 100.0);
        let s_on = run_total(&*on, &eps, &frac, 100.0);
        assert!(s_off[0] > s_off[1] && s_on[0] > s_on[1], "{s_off:?} {s_on:?}");
        assert!(s_on[0] - s_on[1] < s_off[0] - s_off[1], "{s_off:?} {s_on:?}");
        // 100 blocks queued there: realized, the move (136) beats staying (155); credited
        // (110 against 172), the sessions stay on the engine that evicts them.
        eps[0].pending_blocks = 100.0;
        let s_off = run_total(&*off, &eps, &frac, 100.0);
        let s_on = run_total(&*on, &eps, &frac, 100.0);
        assert!(s_off[0] > s_off[1], "{s_off:?}");
        assert!(s_on[1] > s_on[0] && s_on[1] == s_on[2], "{s_on:?}");
    }

    #[test]
    fn realization_is_clamped_and_unmeasured_is_one() {
        let mut sc = crate::scorer::Scorer::new(&Default::default()).unwrap();
        sc.add_endpoint(3);
        let r = |sc: &crate::scorer::Scorer| sc.signals(3).unwrap().hit_realization;
        assert_eq!(r(&sc), 1.0);
        sc.set_realization(3, 0.4);
        assert_eq!(r(&sc), 0.4);
        sc.set_realization(3, 1.7);
        assert_eq!(r(&sc), 1.0);
        sc.set_realization(3, -0.2);
        assert_eq!(r(&sc), 0.0);
        sc.set_realization(3, f64::NAN);
        assert_eq!(r(&sc), 1.0);
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
