//! KV-event ownership table: which endpoint's engine holds which block hash, fed by the
//! engines' KV-cache events (vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`).
//!
//! Keys are `u64` block hashes as the engine reports them (bytes digests go through
//! [`crate::token_hash::block_hash_key`]); a request's chain is computed with a pluggable
//! hasher ([`crate::token_hash`]) and matched here to a per-endpoint prefix length.
//!
//! Only the hashes matter for ownership: each one already identifies its whole prefix
//! (parent, tokens and LoRA are inside it), so `parent_block_hash`, `token_ids`,
//! `block_size` and `lora_id` of `BlockStored` are not needed and not passed.
//!
//! Reference counts: vLLM can cache two blocks with one hash (two requests filled the same
//! block concurrently) and then sends one `BlockStored` and one `BlockRemoved` per block;
//! DP ranks behind one endpoint likewise each report their own copy. A hash stays owned
//! until removed as often as stored.
//!
//! Memory bound: a per-endpoint capacity (set it to the engine's KV block count). The
//! table can only exceed it when removals were missed; it then drops the oldest stored
//! entry (chain tails first, as [`crate::prefix_index`] does) and counts it in
//! [`KvOwnership::overflow_drops`], a desync signal for the caller.
//!
//! Layout: the shared owner table (`crate::owner_table`, as for [`crate::prefix_index`])
//! with the reference count as node payload (32-byte nodes), its recency list kept in store
//! order, and the stream-down flag as per-endpoint extra state.
//!
//! Stream state: an endpoint whose event stream is down (or that lost events) is marked
//! down; matches skip it and list it in `down`, so the caller falls back to the approximate
//! prefix index for it. Marking down clears its entries unless told otherwise: after a gap

use crate::owner_table::{OwnerTable, Touch};

/// Tags of the flat event encoding ([`KvOwnership::apply_flat`]).
pub const TAG_STORED: u64 = 1;
pub const TAG_REMOVED: u64 = 2;
pub const TAG_ALL_CLEARED: u64 = 3;

/// One KV event, borrowed from a decoded batch.
#[derive(Clone, Copy, Debug)]
pub enum KvEvent<'a> {
    Stored(&'a [u64]),
    Removed(&'a [u64]),
    AllCleared,
}

/// See the module docs. Endpoint ids are the caller's `u32`s.
#[derive(Debug)]
pub struct KvOwnership {
    /// Payload: copies of the block the endpoint holds. Endpoint extra: stream down.
    table: OwnerTable<u32, bool>,
    overflow_drops: u64,
    unknown_removals: u64,
}

impl KvOwnership {
    pub fn new(default_capacity: u32) -> Self {
        KvOwnership {
            table: OwnerTable::new(default_capacity),
            overflow_drops: 0,
            unknown_removals: 0,
        }
    }

    /// Distinct (hash, endpoint) entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn endpoint_len(&self, endpoint: u32) -> usize {
        self.table.endpoint_len(endpoint)
    }

    /// Known endpoints, in no set order.
    pub fn endpoints(&self) -> Vec<u32> {
        self.table.endpoints()
    }

    /// Entries dropped because an endpoint exceeded its capacity (missed removals).
    pub fn overflow_drops(&self) -> u64 {
        self.overflow_drops
    }

    /// `BlockRemoved` for hashes the endpoint did not hold (missed stores, or a stream
    /// that started mid-way): another desync signal.
    pub fn unknown_removals(&self) -> u64 {
        self.unknown_removals
    }

    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    /// Set `endpoint`'s capacity in entries (registering it); drops the oldest above it.
    pub fn set_capacity(&mut self, endpoint: u32, cap: u32) {
        self.overflow_drops += self.table.set_capacity(endpoint, cap) as u64;
    }

    /// `BlockStored`: `hashes` in chain order (parent first), as the engine sends them.
    pub fn stored(&mut self, endpoint: u32, hashes: &[u64]) {
        let s = self.table.slot(endpoint);
        // Newest-stored-first list, head of the chain most recent: overflow eats tails.
        for &h in hashes.iter().rev() {
            match self.table.touch(s, h, 1) {
                Touch::Held(n) => {
                    let r = self.table.payload_mut(n);
                    *r = r.saturating_add(1);
                }
                Touch::Added { evicted } => self.overflow_drops += u64::from(evicted),
                Touch::NoRoom => self.overflow_drops += 1,
            }
        }
    }

    /// `BlockRemoved`: one copy of each hash is gone.
    pub fn removed(&mut self, endpoint: u32, hashes: &[u64]) {
        let Some(s) = self.table.slot_of(endpoint) else {
            self.unknown_removals += hashes.len() as u64;
            return;
        };
        for &h in hashes {
            match self.table.find(s, h) {
                None => self.unknown_removals += 1,
                Some(n) if *self.table.payload(n) > 1 => *self.table.payload_mut(n) -= 1,
                Some(n) => self.table.remove(n),
            }
        }
    }

    /// `AllBlocksCleared`: the endpoint holds nothing (it stays registered, with its
    /// capacity and stream state). Returns the entries removed.
    pub fn all_cleared(&mut self, endpoint: u32) -> usize {
        self.table
            .slot_of(endpoint)
            .map_or(0, |s| self.table.clear_slot(s))
    }

    /// Apply a batch in order.
    pub fn apply<'a>(&mut self, endpoint: u32, events: impl IntoIterator<Item = KvEvent<'a>>) {
        for ev in events {
            match ev {
                KvEvent::Stored(h) => self.stored(endpoint, h),
                KvEvent::Removed(h) => self.removed(endpoint, h),
                KvEvent::AllCleared => {
                    self.all_cleared(endpoint);
                }
            }
        }
    }

    /// Apply a batch in the flat encoding: records of `u64` words `tag, n, hash * n` with
    /// tag [`TAG_STORED`], [`TAG_REMOVED`] or [`TAG_ALL_CLEARED`] (n = 0). The whole batch
    /// is validated first, so a malformed batch changes nothing. Returns the event count.
    pub fn apply_flat(&mut self, endpoint: u32, words: &[u64]) -> Result<usize, String> {
        let events = decode_flat(words)?;
        let n = events.len();
        self.apply(endpoint, events);
        Ok(n)
    }

    /// Purge an endpoint that disappeared; returns the entries removed.
    pub fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        self.table.remove_endpoint(endpoint)
    }

    /// Mark the endpoint's event stream down (`true`, clearing its entries if `clear`) or up.
    pub fn set_stream_down(&mut self, endpoint: u32, down: bool, clear: bool) {
        let s = self.table.slot(endpoint);
        *self.table.extra_mut(s) = down;
        if down && clear {
            self.table.clear_slot(s);
        }
    }

    pub fn is_stream_down(&self, endpoint: u32) -> bool {
        self.table
            .slot_of(endpoint)
            .is_some_and(|s| *self.table.extra(s))
    }

    /// Endpoints whose stream is down, in no set order.
    pub fn down_endpoints(&self) -> Vec<u32> {
        self.table.endpoints_where(|&down| down)
    }

    /// Per endpoint whose stream is up, the number of leading blocks of `hashes` it holds
    /// (endpoints with at least one; order unspecified).
    pub fn match_hashes(&mut self, hashes: &[u64], out: &mut Vec<(u32, u32)>) {
        self.table.match_hashes(hashes, out, |&down| !down);
    }

    /// Reference count of `hash` at `endpoint` (0 if not held). For tests and admin views.
    pub fn refs(&self, endpoint: u32, hash: u64) -> u32 {
        self.table
            .slot_of(endpoint)
            .and_then(|s| self.table.find(s, hash))
            .map_or(0, |n| *self.table.payload(n))
    }

    /// Hashes held by `endpoint`, newest stored first (admin checks against the engine).
    pub fn endpoint_hashes(&self, endpoint: u32) -> Vec<u64> {
        self.table.endpoint_hashes(endpoint)
    }

    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.table.check_invariants(|&refs| refs >= 1);
    }
}

/// Decode the flat encoding of [`KvOwnership::apply_flat`] without applying it.
pub fn decode_flat(words: &[u64]) -> Result<Vec<KvEvent<'_>>, String> {
    let mut events = Vec::new();
    let mut i = 0usize;
    while i < words.len() {
        let tag = words[i];
        let n = *words
            .get(i + 1)
            .ok_or_else(|| format!("word {i}: record without a length"))?;
        let start = i + 2;
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&e| e <= words.len())
            .ok_or_else(|| format!("word {i}: length {n} runs past the batch"))?;
        let hashes = &words[start..end];
        events.push(match tag {
            TAG_STORED => KvEvent::Stored(hashes),
            TAG_REMOVED => KvEvent::Removed(hashes),
            TAG_ALL_CLEARED if n == 0 => KvEvent::AllCleared,
            TAG_ALL_CLEARED => return Err(format!("word {i}: AllBlocksCleared with {n} hashes")),
            _ => return Err(format!("word {i}: unknown event tag {tag}")),
        });
        i = end;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token_hash::HashScheme;
    use std::collections::HashMap as StdMap;

    fn matched(t: &mut KvOwnership, hashes: &[u64]) -> StdMap<u32, u32> {
        let mut out = Vec::new();
        t.match_hashes(hashes, &mut out);
        out.into_iter().collect()
    }

    #[test]
    fn stored_removed_cleared() {
        let mut t = KvOwnership::new(100);
        t.apply(1, [KvEvent::Stored(&[10, 11, 12]), KvEvent::Stored(&[13])]);
        t.stored(2, &[10, 11]);
        assert_eq!(
            matched(&mut t, &[10, 11, 12, 13, 14]),
            StdMap::from([(1, 4), (2, 2)])
        );
        t.removed(1, &[12]);
        assert_eq!(
            matched(&mut t, &[10, 11, 12, 13]),
            StdMap::from([(1, 2), (2, 2)])
        );
        assert_eq!(t.all_cleared(2), 2);
        assert_eq!(matched(&mut t, &[10, 11]), StdMap::from([(1, 2)]));
        assert_eq!(t.endpoints().len(), 2); // cleared, still registered
        t.check_invariants();
    }

    #[test]
    fn duplicate_blocks_are_reference_counted() {
        let mut t = KvOwnership::new(100);
        t.stored(1, &[5]);
        t.stored(1, &[5]); // second physical copy of the same block
        assert_eq!((t.len(), t.refs(1, 5)), (1, 2));
        t.removed(1, &[5]);
        assert_eq!(matched(&mut t, &[5]), StdMap::from([(1, 1)]));
        t.removed(1, &[5]);
        assert!(matched(&mut t, &[5]).is_empty());
        t.removed(1, &[5]);
        assert_eq!(t.unknown_removals(), 1);
        t.check_invariants();
    }

    #[test]
    fn capacity_bounds_memory_and_counts_drops() {
        let mut t = KvOwnership::new(3);
        t.stored(1, &[1, 2, 3]);
        t.stored(1, &[4, 5]); // missed removals: drops the oldest tails (3, then 2)
        assert_eq!(t.endpoint_len(1), 3);
        assert_eq!(t.overflow_drops(), 2);
        assert_eq!(matched(&mut t, &[1, 2]), StdMap::from([(1, 1)]));
        assert_eq!(matched(&mut t, &[4, 5]), StdMap::from([(1, 2)]));
        t.set_capacity(1, 1);
        assert_eq!(t.endpoint_len(1), 1);
        t.check_invariants();
    }

    #[test]
    fn stream_down_excluded_from_matches() {
        let mut t = KvOwnership::new(10);
        t.stored(1, &[1, 2]);
        t.stored(2, &[1, 2]);
        t.set_stream_down(1, true, false);
        assert!(t.is_stream_down(1) && !t.is_stream_down(2));
        assert_eq!(t.down_endpoints(), vec![1]);
        assert_eq!(matched(&mut t, &[1, 2]), StdMap::from([(2, 2)]));
        t.set_stream_down(1, false, false);
        assert_eq!(matched(&mut t, &[1, 2]), StdMap::from([(1, 2), (2, 2)]));
        t.set_stream_down(2, true, true);
        assert_eq!(t.endpoint_len(2), 0);
        t.check_invariants();
    }

    #[test]
    fn remove_endpoint_frees_slot() {
        let mut t = KvOwnership::new(10);
        t.stored(1, &[1, 2, 3]);
        t.stored(2, &[1]);
        assert_eq!(t.remove_endpoint(1), 3);
        assert_eq!(t.remove_endpoint(1), 0);
        assert_eq!(matched(&mut t, &[1, 2]), StdMap::from([(2, 1)]));
        t.stored(7, &[9]);
        assert_eq!(t.endpoint_len(7), 1);
        t.check_invariants();
    }

    #[test]
    fn flat_encoding() {
        let mut t = KvOwnership::new(10);
        let batch = [
            TAG_STORED,
            3,
            1,
            2,
            3,
            TAG_REMOVED,
            1,
            3,
            TAG_ALL_CLEARED,
            0,
            TAG_STORED,
            1,
            7,
        ];
        assert_eq!(t.apply_flat(4, &batch), Ok(4));
        assert_eq!(t.endpoint_hashes(4), vec![7]);
        for bad in [
            &[TAG_STORED][..],
            &[TAG_STORED, 2, 1],
            &[9, 0],
            &[TAG_ALL_CLEARED, 1, 5],
        ] {
            let mut batch = vec![TAG_STORED, 1, 99];
            batch.extend_from_slice(bad);
            assert!(t.apply_flat(4, &batch).is_err());
        }
        assert_eq!(t.endpoint_hashes(4), vec![7]); // nothing of the bad batches applied
        assert!(decode_flat(&[TAG_STORED, u64::MAX]).is_err());
    }

    #[test]
    fn token_chain_matches_engine_events() {
        // The engine stores a 3-block prompt; a request sharing 2 blocks matches 2.
        let h = HashScheme::by_name("vllm-sha256-cbor", "0").unwrap();
        let toks: Vec<u32> = (100..148).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        h.chain(&toks, 16, 64, 0, None, None, &mut a);
        let mut other = toks[..32].to_vec();
        other.extend(500..520);
        h.chain(&other, 16, 64, 0, None, None, &mut b);
        let mut t = KvOwnership::new(100);
        t.stored(3, &a);
        assert_eq!(matched(&mut t, &b), StdMap::from([(3, 2)]));
    }

    /// Randomised comparison against a naive model: endpoint -> hash -> refs, unbounded
    /// capacity (the engine's events are complete).
    #[test]
    fn agrees_with_naive_model() {
        let mut rnd = crate::test_rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..50 {
            let mut t = KvOwnership::new(u32::MAX);
            let mut model: StdMap<u32, StdMap<u64, u32>> = StdMap::new();
            let mut down: StdMap<u32, bool> = StdMap::new();
            for _ in 0..300 {
                let ep = rnd(4) as u32;
                let hs: Vec<u64> = (0..rnd(6)).map(|_| rnd(10)).collect();
                match rnd(12) {
                    0 => {
                        t.remove_endpoint(ep);
                        model.remove(&ep);
                        down.remove(&ep);
                    }
                    1 => {
                        t.all_cleared(ep);
                        if let Some(m) = model.get_mut(&ep) {
                            m.clear();
                        }
                    }
                    2 => {
                        let d = rnd(2) == 0;
                        t.set_stream_down(ep, d, false);
                        down.insert(ep, d);
                        model.entry(ep).or_default();
                    }
                    3..=4 => {
                        t.removed(ep, &hs);
                        if let Some(m) = model.get_mut(&ep) {
                            for h in &hs {
                                if let Some(r) = m.get_mut(h) {
                                    *r -= 1;
                                    if *r == 0 {
                                        m.remove(h);
                                    }
                                }
                            }
                        }
                    }
                    5..=8 => {
                        t.stored(ep, &hs);
                        let m = model.entry(ep).or_default();
                        for &h in &hs {
                            *m.entry(h).or_default() += 1;
                        }
                    }
                    _ => {
                        let want: StdMap<u32, u32> = model
                            .iter()
                            .filter(|(e, _)| !down.get(e).copied().unwrap_or(false))
                            .map(|(&e, m)| {
                                (
                                    e,
                                    hs.iter().take_while(|h| m.contains_key(h)).count() as u32,
                                )
                            })
                            .filter(|&(_, k)| k > 0)
                            .collect();
                        assert_eq!(matched(&mut t, &hs), want);
                    }
                }
                for (e, m) in &model {
                    assert_eq!(t.endpoint_len(*e), m.len());
                }
            }
            t.check_invariants();
        }
    }
}
