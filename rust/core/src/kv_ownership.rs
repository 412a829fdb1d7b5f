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
//! Layout as in [`crate::prefix_index`]: a slab of 32-byte nodes linked into the
//! endpoint's store-order list and the same-hash list, and a `hashbrown::HashTable<u32>`
//! from hash to the first node.
//!
//! Stream state: an endpoint whose event stream is down (or that lost events) is marked
//! down; matches skip it and list it in `down`, so the caller falls back to the approximate
//! prefix index for it. Marking down clears its entries unless told otherwise: after a gap
//! they cannot be trusted, and a fresh stream starts from the engine's next events.

use hashbrown::{HashMap, HashTable};

const NIL: u32 = u32::MAX;

/// Tags of the flat event encoding ([`KvOwnership::apply_flat`]).
pub const TAG_STORED: u64 = 1;
pub const TAG_REMOVED: u64 = 2;
pub const TAG_ALL_CLEARED: u64 = 3;

#[derive(Clone, Copy, Debug)]
struct Node {
    hash: u64,
    /// Store-order neighbours (prev = more recent). Free nodes chain via `next`.
    prev: u32,
    next: u32,
    /// Next node with the same hash (another endpoint).
    same: u32,
    ep: u32,
    /// Copies of this block the endpoint holds.
    refs: u32,
}

#[derive(Clone, Debug)]
struct Endpoint {
    id: u32,
    head: u32,
    tail: u32,
    len: u32,
    cap: u32,
    live: bool,
    down: bool,
}

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
    nodes: Vec<Node>,
    free: u32,
    table: HashTable<u32>,
    eps: Vec<Endpoint>,
    slot_of: HashMap<u32, u32>,
    free_eps: Vec<u32>,
    default_cap: u32,
    scratch: Vec<u32>,
    entries: usize,
    overflow_drops: u64,
    unknown_removals: u64,
}

impl KvOwnership {
    pub fn new(default_capacity: u32) -> Self {
        KvOwnership {
            nodes: Vec::new(),
            free: NIL,
            table: HashTable::new(),
            eps: Vec::new(),
            slot_of: HashMap::new(),
            free_eps: Vec::new(),
            default_cap: default_capacity,
            scratch: Vec::new(),
            entries: 0,
            overflow_drops: 0,
            unknown_removals: 0,
        }
    }

    /// Distinct (hash, endpoint) entries.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn endpoint_len(&self, endpoint: u32) -> usize {
        self.slot_of
            .get(&endpoint)
            .map_or(0, |&s| self.eps[s as usize].len as usize)
    }

    /// Known endpoints, in no set order.
    pub fn endpoints(&self) -> Vec<u32> {
        self.slot_of.keys().copied().collect()
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
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.table.allocation_size()
            + self.eps.capacity() * std::mem::size_of::<Endpoint>()
            + self.slot_of.allocation_size()
            + self.free_eps.capacity() * 4
            + self.scratch.capacity() * 4
    }

    fn slot(&mut self, endpoint: u32) -> u32 {
        if let Some(&s) = self.slot_of.get(&endpoint) {
            return s;
        }
        let ep = Endpoint {
            id: endpoint,
            head: NIL,
            tail: NIL,
            len: 0,
            cap: self.default_cap,
            live: true,
            down: false,
        };
        let s = match self.free_eps.pop() {
            Some(s) => {
                self.eps[s as usize] = ep;
                s
            }
            None => {
                self.eps.push(ep);
                self.scratch.push(0);
                (self.eps.len() - 1) as u32
            }
        };
        self.slot_of.insert(endpoint, s);
        s
    }

    /// Set `endpoint`'s capacity in entries (registering it); drops the oldest above it.
    pub fn set_capacity(&mut self, endpoint: u32, cap: u32) {
        let s = self.slot(endpoint);
        self.eps[s as usize].cap = cap;
        while self.eps[s as usize].len > cap {
            let t = self.eps[s as usize].tail;
            self.remove_node(t);
            self.overflow_drops += 1;
        }
    }

    #[inline]
    fn head_of(&self, hash: u64) -> u32 {
        let nodes = &self.nodes;
        self.table
            .find(hash, |&i| nodes[i as usize].hash == hash)
            .copied()
            .unwrap_or(NIL)
    }

    fn find_node(&self, slot: u32, hash: u64) -> u32 {
        let mut n = self.head_of(hash);
        while n != NIL && self.nodes[n as usize].ep != slot {
            n = self.nodes[n as usize].same;
        }
        n
    }

    fn list_unlink(&mut self, n: u32) {
        let Node { prev, next, ep, .. } = self.nodes[n as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.eps[ep as usize].head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.eps[ep as usize].tail = prev;
        }
    }

    fn list_push_front(&mut self, n: u32) {
        let ep = self.nodes[n as usize].ep as usize;
        let old = self.eps[ep].head;
        self.nodes[n as usize].prev = NIL;
        self.nodes[n as usize].next = old;
        if old != NIL {
            self.nodes[old as usize].prev = n;
        } else {
            self.eps[ep].tail = n;
        }
        self.eps[ep].head = n;
    }

    /// Unlink node `n` from both lists and free it, whatever its reference count.
    fn remove_node(&mut self, n: u32) {
        self.list_unlink(n);
        let Node { hash, same, ep, .. } = self.nodes[n as usize];
        let nodes = &self.nodes;
        let mut pred = NIL;
        if let Ok(entry) = self
            .table
            .find_entry(hash, |&i| nodes[i as usize].hash == hash)
        {
            let head = *entry.get();
            if head == n {
                if same == NIL {
                    entry.remove();
                } else {
                    *entry.into_mut() = same;
                }
            } else {
                pred = head;
            }
        }
        while pred != NIL && self.nodes[pred as usize].same != n {
            pred = self.nodes[pred as usize].same;
        }
        if pred != NIL {
            self.nodes[pred as usize].same = same;
        }
        self.eps[ep as usize].len -= 1;
        self.entries -= 1;
        self.nodes[n as usize].next = self.free;
        self.free = n;
    }

    fn alloc(&mut self, node: Node) -> u32 {
        if self.free != NIL {
            let n = self.free;
            self.free = self.nodes[n as usize].next;
            self.nodes[n as usize] = node;
            n
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// `BlockStored`: `hashes` in chain order (parent first), as the engine sends them.
    pub fn stored(&mut self, endpoint: u32, hashes: &[u64]) {
        let s = self.slot(endpoint);
        // Newest-stored-first list, head of the chain most recent: overflow eats tails.
        for &h in hashes.iter().rev() {
            let head = self.head_of(h);
            let mut n = head;
            while n != NIL && self.nodes[n as usize].ep != s {
                n = self.nodes[n as usize].same;
            }
            if n != NIL {
                let r = &mut self.nodes[n as usize].refs;
                *r = r.saturating_add(1);
                if self.eps[s as usize].head != n {
                    self.list_unlink(n);
                    self.list_push_front(n);
                }
                continue;
            }
            if self.eps[s as usize].cap == 0 {
                self.overflow_drops += 1;
                continue;
            }
            // The dropped node is this endpoint's and not `h`: `head` stays valid.
            if self.eps[s as usize].len >= self.eps[s as usize].cap {
                let t = self.eps[s as usize].tail;
                self.remove_node(t);
                self.overflow_drops += 1;
            }
            let n = self.alloc(Node {
                hash: h,
                prev: NIL,
                next: NIL,
                same: NIL,
                ep: s,
                refs: 1,
            });
            if head == NIL {
                let nodes = &self.nodes;
                self.table.insert_unique(h, n, |&i| nodes[i as usize].hash);
            } else {
                self.nodes[n as usize].same = self.nodes[head as usize].same;
                self.nodes[head as usize].same = n;
            }
            self.list_push_front(n);
            self.eps[s as usize].len += 1;
            self.entries += 1;
        }
    }

    /// `BlockRemoved`: one copy of each hash is gone.
    pub fn removed(&mut self, endpoint: u32, hashes: &[u64]) {
        let Some(&s) = self.slot_of.get(&endpoint) else {
            self.unknown_removals += hashes.len() as u64;
            return;
        };
        for &h in hashes {
            let n = self.find_node(s, h);
            if n == NIL {
                self.unknown_removals += 1;
            } else if self.nodes[n as usize].refs > 1 {
                self.nodes[n as usize].refs -= 1;
            } else {
                self.remove_node(n);
            }
        }
    }

    /// `AllBlocksCleared`: the endpoint holds nothing (it stays registered, with its
    /// capacity and stream state). Returns the entries removed.
    pub fn all_cleared(&mut self, endpoint: u32) -> usize {
        let Some(&s) = self.slot_of.get(&endpoint) else {
            return 0;
        };
        let mut removed = 0;
        while self.eps[s as usize].tail != NIL {
            let t = self.eps[s as usize].tail;
            self.remove_node(t);
            removed += 1;
        }
        removed
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
        if !self.slot_of.contains_key(&endpoint) {
            return 0;
        }
        let removed = self.all_cleared(endpoint);
        let s = self.slot_of.remove(&endpoint).unwrap_or(NIL);
        self.eps[s as usize].live = false;
        self.free_eps.push(s);
        removed
    }

    /// Mark the endpoint's event stream down (`true`, clearing its entries if `clear`) or up.
    pub fn set_stream_down(&mut self, endpoint: u32, down: bool, clear: bool) {
        let s = self.slot(endpoint);
        self.eps[s as usize].down = down;
        if down && clear {
            self.all_cleared(endpoint);
        }
    }

    pub fn is_stream_down(&self, endpoint: u32) -> bool {
        self.slot_of
            .get(&endpoint)
            .is_some_and(|&s| self.eps[s as usize].down)
    }

    /// Endpoints whose stream is down, in no set order.
    pub fn down_endpoints(&self) -> Vec<u32> {
        self.slot_of
            .iter()
            .filter(|(_, &s)| self.eps[s as usize].down)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Per endpoint whose stream is up, the number of leading blocks of `hashes` it holds
    /// (endpoints with at least one; order unspecified).
    pub fn match_hashes(&mut self, hashes: &[u64], out: &mut Vec<(u32, u32)>) {
        out.clear();
        let mut touched: Vec<u32> = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            let i = i as u32;
            let mut n = self.head_of(h);
            let mut advanced = false;
            while n != NIL {
                let node = &self.nodes[n as usize];
                let c = &mut self.scratch[node.ep as usize];
                if *c == i && !self.eps[node.ep as usize].down {
                    *c = i + 1;
                    advanced = true;
                    if i == 0 {
                        touched.push(node.ep);
                    }
                }
                n = node.same;
            }
            if !advanced {
                break;
            }
        }
        for s in touched {
            let c = &mut self.scratch[s as usize];
            out.push((self.eps[s as usize].id, *c));
            *c = 0;
        }
    }

    /// Reference count of `hash` at `endpoint` (0 if not held). For tests and admin views.
    pub fn refs(&self, endpoint: u32, hash: u64) -> u32 {
        let Some(&s) = self.slot_of.get(&endpoint) else {
            return 0;
        };
        let n = self.find_node(s, hash);
        if n == NIL {
            0
        } else {
            self.nodes[n as usize].refs
        }
    }

    /// Hashes held by `endpoint`, newest stored first (admin checks against the engine).
    pub fn endpoint_hashes(&self, endpoint: u32) -> Vec<u64> {
        let mut v = Vec::new();
        if let Some(&s) = self.slot_of.get(&endpoint) {
            let mut n = self.eps[s as usize].head;
            while n != NIL {
                v.push(self.nodes[n as usize].hash);
                n = self.nodes[n as usize].next;
            }
        }
        v
    }

    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut total = 0usize;
        for (s, ep) in self.eps.iter().enumerate() {
            if !ep.live {
                assert_eq!(ep.len, 0);
                continue;
            }
            assert_eq!(self.slot_of.get(&ep.id), Some(&(s as u32)));
            let (mut n, mut prev, mut len) = (ep.head, NIL, 0);
            while n != NIL {
                let node = &self.nodes[n as usize];
                assert_eq!(node.ep as usize, s);
                assert_eq!(node.prev, prev);
                assert!(node.refs >= 1);
                assert_eq!(self.find_node(s as u32, node.hash), n);
                prev = n;
                n = node.next;
                len += 1;
            }
            assert_eq!(ep.tail, prev);
            assert_eq!(len, ep.len);
            assert!(ep.len <= ep.cap);
            total += len as usize;
        }
        assert_eq!(total, self.entries);
        let mut chained = 0usize;
        for &head in self.table.iter() {
            let mut n = head;
            while n != NIL {
                chained += 1;
                n = self.nodes[n as usize].same;
            }
        }
        assert_eq!(chained, self.entries);
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
        h.chain(&toks, 16, 64, 0, None, &mut a);
        let mut other = toks[..32].to_vec();
        other.extend(500..520);
        h.chain(&other, 16, 64, 0, None, &mut b);
        let mut t = KvOwnership::new(100);
        t.stored(3, &a);
        assert_eq!(matched(&mut t, &b), StdMap::from([(3, 2)]));
    }

    /// Randomised comparison against a naive model: endpoint -> hash -> refs, unbounded
    /// capacity (the engine's events are complete).
    #[test]
    fn agrees_with_naive_model() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
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
