//! `prefix-hash-bounded` (ours): consistent hashing with bounded loads (Mirrokni, Thorup,
//! Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018) on the request's
//! prefix key, for several router replicas that must agree without shared state.
//!
//! * Key: [`Ctx::prefix_key`], the chain hash of the request's leading prompt blocks
//!   ([`crate::prefix_hash::prefix_key`], computed by the router from the plugin's
//!   `blockSizeToHash` and `prefixKeyBlocks`), else the request-id hash.
//! * Order: rendezvous (highest random weight) hashing: each endpoint's weight is a hash of
//!   (key, endpoint identity), where the identity is the endpoint's address
//!   ([`crate::scorer::Signals::identity`]), never a per-process id. Every replica with the
//!   same endpoint set ranks a key identically; an endpoint joining takes ~1/N of the keys
//!   and an endpoint leaving gives away only its own; no ring to keep.
//! * Bound: with `c` = `loadFactor`, `m` = the candidates' in-flight requests plus this one
//!   and `n` candidates, an endpoint takes the request only while its in-flight count is
//!   below `ceil(c * m / n)`; the first endpoint in the key's order under the bound wins,
//!   the others follow in the same order (failover). Some endpoint is always under the bound
//!   (c >= 1). Load is the router's own in-flight count per endpoint: exact and current
//!   (a scrape is up to an interval old), and the same quantity on every replica; each
//!   replica bounds its own share, so an engine's total stays under about c x the mean
//!   plus one request per replica.
//!
//! Default c = 1.25: the paper's analysis gives O(1/eps^2) expected moves per insertion for
//! c = 1 + eps, so c close to 1 reshuffles keys under every fluctuation, while a large c
//! lets a hot prefix pile up on one engine; 1.25 (no engine above 125% of the mean) is the
//! common default of bounded-load implementations (liblb, brpc; HAProxy's
//! hash-balance-factor is the same c in percent): hot keys spill to their second endpoint,
//! cold keys never move.
//!
//! Scores are ranks: the chosen endpoint 1, then (n - r) / n for rank r. Use it alone (or
//! with the largest weight): other score plugins mixed in re-order by signals that differ
//! between replicas. Not an affinity policy for the hot-spot guard: the bound is its guard.

use super::{ArgSpec, Args, Ctx, Policy, PolicyInfo, Value};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Ours: bytes per hashed block of the key (prefix-cache's granularity).
const BLOCK_BYTES: ArgSpec = ArgSpec::int("blockSizeToHash", "block_size_to_hash", Value::Int(64))
    .positive()
    .ours()
    .router();
/// Ours: leading blocks that make the key: 16 x 64 bytes = the first 1 KiB of the rendered
/// prompt (a system prompt, or the first turn of a conversation); a longer shared prefix
/// then maps to one engine, a shorter one is told apart by what follows it.
const KEY_BLOCKS: ArgSpec = ArgSpec::int("prefixKeyBlocks", "prefix_key_blocks", Value::Int(16))
    .positive()
    .ours()
    .router();
/// Ours: c of the bound, refused below 1 (no placement could meet it) and above 100.
const LOAD_FACTOR: ArgSpec = ArgSpec::float("loadFactor", "load_factor", 1.25)
    .range(1.0, 100.0)
    .ours();

pub const INFO: PolicyInfo = PolicyInfo {
    prefix_key: true,
    args: &[BLOCK_BYTES, KEY_BLOCKS, LOAD_FACTOR],
    ..PolicyInfo::score("prefix-hash-bounded", build)
};

fn build(args: &Args) -> Result<Box<dyn Policy>, String> {
    let factor = args.value(&LOAD_FACTOR).unwrap_or(1.25);
    Ok(Box::new(PrefixHashBounded { factor }))
}

pub struct PrefixHashBounded {
    factor: f64,
}

/// Rendezvous weight of `identity` for `key`.
#[inline]
pub fn weight(key: u64, identity: u64) -> u64 {
    xxh3_64_with_seed(&identity.to_le_bytes(), key)
}

/// The bound: an endpoint with `load` in flight may take one more while `load < cap`.
#[inline]
pub fn capacity(factor: f64, in_flight_total: u64, n: usize) -> u64 {
    let m = (in_flight_total + 1) as f64;
    // The epsilon keeps 1.1 * 10 / 1 = 11.000000000000002 at 11.
    (factor * m / n as f64 - 1e-9).ceil().max(1.0) as u64
}

impl Policy for PrefixHashBounded {
    fn name(&self) -> &'static str {
        "prefix-hash-bounded"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let n = cands.len();
        if n == 0 {
            return;
        }
        let load = |s: u32| u64::from(ctx.eps[s as usize].in_flight);
        let cap = capacity(self.factor, cands.iter().map(|&s| load(s)).sum(), n);
        // (over the bound, weight, position): under the bound first, heaviest first.
        let mut order: Vec<(bool, u64, usize)> = cands
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let id = ctx.eps[s as usize].identity;
                (load(s) >= cap, weight(ctx.prefix_key, id), i)
            })
            .collect();
        order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        for (rank, &(_, _, i)) in order.iter().enumerate() {
            out[i] = (n - rank) as f64 / n as f64;
        }
    }
}

#[cfg(test)]
#[path = "prefix_hash_bounded_tests.rs"]
mod tests;
