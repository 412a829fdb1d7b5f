//! Approximate prefix-cache index: which endpoint holds which chain hash
//! (see [`crate::prefix_hash`]), with a per-endpoint LRU capacity.
//!
//! A thin layer over the shared owner table (`crate::owner_table`, whose docs describe the
//! layout) with an empty payload, so an entry costs one 24-byte node plus its table slot
//! (target <= 64 bytes per (block, endpoint) entry).
//!
//! Optional evicted-owner hints ([`crate::evicted_hints`]): entries the index drops for
//! capacity are remembered as decaying hints of their last owner, and a match extends an
//! endpoint's run past what the index holds by the hints' weights (see `match_hashes`).

use crate::evicted_hints::EvictedHints;
use crate::owner_table::{OwnerTable, Touch};
use crate::prefix_traffic::PrefixTraffic;

/// See the module docs. Endpoint ids are the caller's `u32`s.
#[derive(Debug)]
pub struct PrefixIndex {
    table: OwnerTable<()>,
    hints: Option<EvictedHints>,
    /// Dispatch traffic per prefix key (prefix-cache's balanceMisses), fed by `insert`.
    traffic: Option<PrefixTraffic>,
    /// Per-match scratch of `match_hashes` with hints (kept to avoid an allocation).
    runs: Vec<HintRun>,
}

/// One endpoint's run during a hinted match.
#[derive(Clone, Copy, Debug)]
struct HintRun {
    ep: u32,
    /// Leading blocks the index holds.
    held: u32,
    /// One past the furthest block at or after `held` whose hint names `ep` (0: none).
    end: u32,
    weight: f64,
    hints: u32,
}

impl HintRun {
    fn new(ep: u32, held: u32) -> Self {
        HintRun {
            ep,
            held,
            end: 0,
            weight: 0.0,
            hints: 0,
        }
    }
}

impl PrefixIndex {
    /// `default_capacity`: entries an endpoint may hold unless [`Self::set_capacity`] says otherwise.
    pub fn new(default_capacity: u32) -> Self {
        PrefixIndex {
            table: OwnerTable::new(default_capacity),
            hints: None,
            traffic: None,
            runs: Vec::new(),
        }
    }

    /// Count each insert as a dispatch of its prompt's prefix key (`key_blocks` blocks; 0:
    /// stop counting), for [`Self::miss_scores`].
    pub fn track_traffic(&mut self, key_blocks: usize) {
        self.traffic = (key_blocks > 0).then(|| PrefixTraffic::new(key_blocks));
    }

    /// balanceMisses' scores for a prompt no endpoint holds (see
    /// [`PrefixTraffic::miss_scores`]); nothing without traffic tracking.
    pub fn miss_scores(&mut self, ids: &[u32], total: u32) -> Vec<(u32, u32)> {
        self.traffic.as_mut().map_or_else(Vec::new, |t| t.miss_scores(ids, total))
    }

    /// [`Self::new`] with an evicted-owner hint table of `hint_slots` entries (rounded up
    /// to a power of two; 0 = no hints).
    pub fn with_hints(default_capacity: u32, hint_slots: u32) -> Self {
        PrefixIndex {
            table: OwnerTable::new(default_capacity),
            hints: (hint_slots > 0).then(|| EvictedHints::new(hint_slots)),
            traffic: None,
            runs: Vec::new(),
        }
    }

    /// Slots of the hint table (0 without hints).
    pub fn hint_slots(&self) -> usize {
        self.hints.as_ref().map_or(0, EvictedHints::slots)
    }

    /// Total (block, endpoint) entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Entries held by `endpoint` (0 if unknown).
    pub fn endpoint_len(&self, endpoint: u32) -> usize {
        self.table.endpoint_len(endpoint)
    }

    /// Known endpoints (inserted or given a capacity, and not removed), in no set order.
    pub fn endpoints(&self) -> Vec<u32> {
        self.table.endpoints()
    }

    /// Bytes allocated by the index (slab, hash table, endpoint tables).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes() + self.hints.as_ref().map_or(0, EvictedHints::memory_bytes)
    }

    /// Set `endpoint`'s capacity (registering it), evicting its LRU entries above it.
    pub fn set_capacity(&mut self, endpoint: u32, cap: u32) {
        if let Some(hints) = &mut self.hints {
            let s = self.table.slot(endpoint);
            while self.table.endpoint_len(endpoint) > cap as usize {
                let Some(h) = self.table.tail_hash(s) else {
                    break;
                };
                let n = self.table.find(s, h).expect("the tail is held");
                self.table.remove(n);
                hints.record(endpoint, h);
            }
        }
        self.table.set_capacity(endpoint, cap);
    }

    /// Record that `endpoint` holds the chain `hashes` (request dispatched there). Blocks are
    /// touched from the last to the first, so the chain's head ends most recently used and
    /// eviction eats chains from their tails (a lost head would void the whole chain).
    pub fn insert(&mut self, endpoint: u32, hashes: &[u64]) {
        if let Some(t) = &mut self.traffic {
            t.record(endpoint, hashes);
        }
        let s = self.table.slot(endpoint);
        if self.table.cap(s) == 0 {
            return;
        }
        let Some(hints) = &mut self.hints else {
            for &h in hashes.iter().rev() {
                self.table.touch(s, h, ());
            }
            return;
        };
        for &h in hashes.iter().rev() {
            // A full endpoint evicts its tail to add `h` (which it does not hold then).
            let victim = self.table.tail_hash(s);
            if let Touch::Added { evicted: true } = self.table.touch(s, h, ()) {
                if let Some(v) = victim {
                    hints.record(endpoint, v);
                }
            }
        }
    }

    /// Per endpoint, the number of leading blocks of `hashes` it holds, for endpoints with
    /// at least one; order unspecified. Read-only for the LRU (ownership is recorded by
    /// `insert` at dispatch).
    ///
    /// With hints, an endpoint's run extends past the index's blocks to the furthest block
    /// of the chain whose hint names it, at the mean weight of those hints (< 1), rounded
    /// up to whole blocks; an endpoint the index lists for none of the chain can be listed
    /// through hints alone. A chain hash covers the whole prefix before it, so a hint on a
    /// later block says its owner held every earlier one too: gaps (hints overwritten in
    /// the direct-mapped table) do not end the run. One table read per block of the chain.
    pub fn match_hashes(&mut self, hashes: &[u64], out: &mut Vec<(u32, u32)>) {
        self.table.match_hashes(hashes, out, |_| true);
        if self.hints.is_some() && !hashes.is_empty() {
            self.extend_with_hints(hashes, out);
        }
    }

    fn extend_with_hints(&mut self, hashes: &[u64], out: &mut Vec<(u32, u32)>) {
        let Some(hints) = &self.hints else {
            return;
        };
        let table = &self.table;
        let cap_of = |ep: u32| table.slot_of(ep).map_or(0, |s| table.cap(s));
        let runs = &mut self.runs;
        runs.clear();
        runs.extend(out.iter().map(|&(ep, k)| HintRun::new(ep, k)));
        for (i, &h) in hashes.iter().enumerate() {
            let Some((ep, w)) = hints.lookup(h, cap_of) else {
                continue;
            };
            let r = match runs.iter().position(|r| r.ep == ep) {
                Some(p) => &mut runs[p],
                None => {
                    runs.push(HintRun::new(ep, 0));
                    runs.last_mut().expect("just pushed")
                }
            };
            let i = i as u32;
            if i >= r.held {
                r.end = i + 1;
                r.weight += w;
                r.hints += 1;
            }
        }
        out.clear();
        for r in runs.iter() {
            let mut k = r.held;
            if r.hints > 0 {
                let mean = r.weight / f64::from(r.hints);
                // Up: a faded hint still beats no opinion (it only tips otherwise equal
                // endpoints).
                k += (f64::from(r.end - r.held) * mean).ceil() as u32;
            }
            if k > 0 {
                out.push((r.ep, k));
            }
        }
    }

    /// Forget `hashes` for `endpoint` (e.g. the engine reported them evicted).
    pub fn evict(&mut self, endpoint: u32, hashes: &[u64]) -> usize {
        let Some(s) = self.table.slot_of(endpoint) else {
            return 0;
        };
        let mut removed = 0;
        for &h in hashes {
            if let Some(hints) = &mut self.hints {
                hints.forget(endpoint, h);
            }
            if let Some(n) = self.table.find(s, h) {
                self.table.remove(n);
                removed += 1;
            }
        }
        removed
    }

    /// Purge an endpoint that disappeared; returns the entries removed.
    pub fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        if let Some(hints) = &mut self.hints {
            hints.remove_endpoint(endpoint);
        }
        if let Some(t) = &mut self.traffic {
            t.remove_endpoint(endpoint);
        }
        self.table.remove_endpoint(endpoint)
    }

    /// Internal consistency check for tests: every list agrees with the counters.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.table.check_invariants(|_| true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as StdMap;

    fn matched(ix: &mut PrefixIndex, hashes: &[u64]) -> StdMap<u32, u32> {
        let mut out = Vec::new();
        ix.match_hashes(hashes, &mut out);
        out.into_iter().collect()
    }

    #[test]
    fn longest_consecutive_prefix_per_endpoint() {
        let mut ix = PrefixIndex::new(100);
        ix.insert(1, &[10, 11, 12]);
        ix.insert(2, &[10, 11]);
        ix.insert(3, &[11, 12]); // holds later blocks but not the head
        let m = matched(&mut ix, &[10, 11, 12, 13]);
        assert_eq!(m, StdMap::from([(1, 3), (2, 2)]));
        assert!(matched(&mut ix, &[99]).is_empty());
        // Scratch was reset: a second identical call gives the same answer.
        assert_eq!(matched(&mut ix, &[10, 11, 12, 13]), m);
        ix.check_invariants();
    }

    #[test]
    fn lru_evicts_chain_tails_first() {
        let mut ix = PrefixIndex::new(4);
        ix.insert(1, &[1, 2, 3]);
        ix.insert(1, &[7, 8]); // 5 entries > 4: evicts the LRU one, the tail 3 of the old chain
        assert_eq!(ix.endpoint_len(1), 4);
        assert_eq!(matched(&mut ix, &[1, 2, 3]), StdMap::from([(1, 2)]));
        assert_eq!(matched(&mut ix, &[7, 8]), StdMap::from([(1, 2)]));
        ix.insert(1, &[1]); // touch 1: next eviction takes 2
        ix.insert(1, &[9]);
        assert_eq!(matched(&mut ix, &[1, 2]), StdMap::from([(1, 1)]));
        ix.check_invariants();
    }

    #[test]
    fn reinsert_does_not_duplicate() {
        let mut ix = PrefixIndex::new(10);
        ix.insert(1, &[1, 2]);
        ix.insert(1, &[1, 2]);
        ix.insert(1, &[1, 1]);
        assert_eq!(ix.len(), 2);
        ix.check_invariants();
    }

    #[test]
    fn remove_endpoint_and_evict() {
        let mut ix = PrefixIndex::new(10);
        ix.insert(1, &[1, 2, 3]);
        ix.insert(2, &[1, 2, 3]);
        assert_eq!(ix.evict(2, &[2, 42]), 1);
        assert_eq!(matched(&mut ix, &[1, 2, 3]), StdMap::from([(1, 3), (2, 1)]));
        assert_eq!(ix.remove_endpoint(1), 3);
        assert_eq!(ix.remove_endpoint(1), 0);
        assert_eq!(matched(&mut ix, &[1, 2, 3]), StdMap::from([(2, 1)]));
        assert_eq!(ix.len(), 2);
        ix.check_invariants();
        // Slot reuse: a new endpoint starts empty.
        ix.insert(5, &[1]);
        assert_eq!(ix.endpoint_len(5), 1);
        assert_eq!(ix.evict(9, &[1]), 0);
        ix.check_invariants();
    }

    #[test]
    fn capacity_changes() {
        let mut ix = PrefixIndex::new(0);
        ix.insert(1, &[1, 2]);
        assert_eq!(ix.len(), 0);
        ix.set_capacity(1, 3);
        ix.insert(1, &[1, 2, 3, 4]);
        assert_eq!(matched(&mut ix, &[1, 2, 3, 4]), StdMap::from([(1, 3)]));
        ix.set_capacity(1, 1);
        assert_eq!(matched(&mut ix, &[1, 2, 3, 4]), StdMap::from([(1, 1)]));
        ix.check_invariants();
    }

    /// Randomised comparison against a naive model (Vec per endpoint in LRU order).
    #[test]
    fn agrees_with_naive_model() {
        let mut rnd = crate::test_rng(0x2545_F491_4F6C_DD1D);
        for _round in 0..50 {
            let cap = 1 + rnd(8) as u32;
            let mut ix = PrefixIndex::new(cap);
            let mut model: StdMap<u32, Vec<u64>> = StdMap::new(); // front = MRU
            for _ in 0..300 {
                let ep = rnd(4) as u32;
                let hs: Vec<u64> = (0..rnd(6)).map(|_| rnd(12)).collect();
                match rnd(10) {
                    0 => {
                        ix.remove_endpoint(ep);
                        model.remove(&ep);
                    }
                    1 => {
                        ix.evict(ep, &hs);
                        if let Some(v) = model.get_mut(&ep) {
                            v.retain(|h| !hs.contains(h));
                        }
                    }
                    2..=5 => {
                        ix.insert(ep, &hs);
                        let v = model.entry(ep).or_default();
                        for &h in hs.iter().rev() {
                            if let Some(p) = v.iter().position(|&y| y == h) {
                                v.remove(p);
                            } else if v.len() as u32 >= cap {
                                v.pop();
                            }
                            v.insert(0, h);
                        }
                    }
                    _ => {
                        let got = matched(&mut ix, &hs);
                        let want: StdMap<u32, u32> = model
                            .iter()
                            .map(|(&e, v)| {
                                (e, hs.iter().take_while(|h| v.contains(h)).count() as u32)
                            })
                            .filter(|&(_, k)| k > 0)
                            .collect();
                        assert_eq!(got, want);
                    }
                }
            }
            ix.check_invariants();
        }
    }

    #[test]
    fn hints_extend_runs_past_evicted_blocks() {
        let mut plain = PrefixIndex::new(4);
        let mut ix = PrefixIndex::with_hints(4, 1000);
        assert_eq!(ix.hint_slots(), 1024);
        for x in [&mut plain, &mut ix] {
            x.insert(1, &[1, 2, 3, 4]);
            x.insert(1, &[10, 11, 12, 13]); // evicts 4, 3, 2, 1 (tails first)
            x.insert(2, &[1]);
        }
        assert_eq!(matched(&mut plain, &[1, 2, 3, 4]), StdMap::from([(2, 1)]));
        // Endpoint 1's hints, ages 0..3 evictions at capacity 4 (half-life 16): mean weight
        // ~0.47 over 4 blocks = 1.9 -> 2 blocks. Endpoint 2 holds block 1 only.
        assert_eq!(
            matched(&mut ix, &[1, 2, 3, 4]),
            StdMap::from([(1, 2), (2, 1)])
        );
        // A chain the index and hints both know: the index's full run is not changed.
        assert_eq!(matched(&mut ix, &[10, 11, 12, 13]), StdMap::from([(1, 4)]));
        // The engine says it evicted the chain: endpoint 1's hints for it are void.
        ix.evict(1, &[1, 2, 3, 4]);
        assert_eq!(matched(&mut ix, &[1, 2, 3, 4]), StdMap::from([(2, 1)]));
        ix.check_invariants();
    }

    #[test]
    fn an_overwritten_hint_does_not_end_the_run() {
        let mut ix = PrefixIndex::with_hints(8, 16);
        ix.insert(1, &[1, 2, 3, 4, 5, 6, 7, 8]);
        ix.insert(1, &[30, 31, 32, 33, 34, 35, 36, 37]); // 1..8 become hints
        ix.set_capacity(2, 1);
        ix.insert(2, &[20]);
        ix.insert(2, &[50]); // 20 becomes a hint in slot 20 % 16 = 4: block 4's is gone
                             // Block 8's hint says endpoint 1 held the whole chain: 8 blocks at a mean weight of
                             // ~0.46 (ages 0..7 of a 32-eviction half-life) -> 4; stopping at the gap would give 2.
        assert_eq!(
            matched(&mut ix, &[1, 2, 3, 4, 5, 6, 7, 8]),
            StdMap::from([(1, 4)])
        );
        ix.check_invariants();
    }

    #[test]
    fn hints_from_shrinking_and_removed_endpoints() {
        let mut ix = PrefixIndex::with_hints(100, 64);
        ix.insert(1, &[1, 2, 3, 4, 5, 6]);
        ix.set_capacity(1, 2); // drops 3..6 into hints
        assert_eq!(ix.endpoint_len(1), 2);
        let m = matched(&mut ix, &[1, 2, 3, 4, 5, 6]);
        assert!(m[&1] > 2 && m[&1] < 6, "{m:?}");
        ix.set_capacity(1, 0); // no capacity: hints weigh nothing
        assert!(matched(&mut ix, &[1, 2, 3]).is_empty());
        ix.set_capacity(1, 2);
        ix.remove_endpoint(1);
        ix.insert(2, &[9]);
        assert!(matched(&mut ix, &[1, 2, 3]).is_empty());
        ix.check_invariants();
    }

    /// With hints, every endpoint the plain index lists is listed with at least its plain
    /// run and at most the chain; the index itself (entries per endpoint) is unchanged.
    #[test]
    fn hints_only_add_to_plain_matches() {
        let mut rnd = crate::test_rng(0x9E37_79B9_7F4A_7C15);
        for _round in 0..30 {
            let cap = 1 + rnd(6) as u32;
            let mut plain = PrefixIndex::new(cap);
            let mut ix = PrefixIndex::with_hints(cap, 1 + rnd(64) as u32);
            for _ in 0..300 {
                let ep = rnd(4) as u32;
                let hs: Vec<u64> = (0..1 + rnd(6)).map(|_| rnd(16)).collect();
                match rnd(12) {
                    0 => {
                        plain.remove_endpoint(ep);
                        ix.remove_endpoint(ep);
                    }
                    1 => {
                        plain.evict(ep, &hs);
                        ix.evict(ep, &hs);
                    }
                    2 => {
                        let c = rnd(5) as u32;
                        plain.set_capacity(ep, c);
                        ix.set_capacity(ep, c);
                    }
                    3..=6 => {
                        plain.insert(ep, &hs);
                        ix.insert(ep, &hs);
                    }
                    _ => {
                        let want = matched(&mut plain, &hs);
                        let got = matched(&mut ix, &hs);
                        for (e, k) in &want {
                            assert!(got[e] >= *k, "{got:?} vs {want:?}");
                        }
                        for k in got.values() {
                            assert!(*k >= 1 && *k as usize <= hs.len());
                        }
                    }
                }
                assert_eq!(plain.len(), ix.len());
            }
            ix.check_invariants();
        }
    }

    #[test]
    fn memory_per_entry_under_target() {
        // 100 endpoints x 10k entries, random chains: the benchmark's shape.
        let mut ix = PrefixIndex::new(10_000);
        let mut h: u64 = 1;
        for ep in 0..100u32 {
            for _ in 0..100 {
                let chain: Vec<u64> = (0..100)
                    .map(|_| {
                        h = h
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        h
                    })
                    .collect();
                ix.insert(ep, &chain);
            }
        }
        assert_eq!(ix.len(), 1_000_000);
        let per = ix.memory_bytes() as f64 / ix.len() as f64;
        eprintln!("prefix index: {per:.1} bytes per entry");
        assert!(per <= 64.0, "{per} bytes per entry");
    }
}
