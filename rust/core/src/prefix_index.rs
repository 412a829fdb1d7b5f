//! Approximate prefix-cache index: which endpoint holds which chain hash
//! (see [`crate::prefix_hash`]), with a per-endpoint LRU capacity.
//!
//! Layout, chosen for memory (target <= 64 bytes per (block, endpoint) entry):
//! * one 24-byte [`Node`] per entry in a slab (`nodes`), linked twice: into its endpoint's
//!   LRU list (doubly linked, O(1) touch and evict) and into the singly linked list of the
//!   entries with the same hash (one per endpoint holding it, so short);
//! * a `hashbrown::HashTable<u32>` from hash to the first node of that same-hash list. It
//!   stores only the node index (4 bytes + 1 control byte per slot): the key is read from
//!   the node, and the chain hash is used as the table hash directly (it already is one).
//!
//! A match walks the prompt's chain and, per block, the endpoints holding it; it stops at the
//! first block that no endpoint still in the race holds, so a cache miss costs one lookup.

use hashbrown::{HashMap, HashTable};

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    hash: u64,
    /// LRU neighbours in the endpoint's list (prev = more recent). Free nodes chain via `next`.
    prev: u32,
    next: u32,
    /// Next node with the same hash (another endpoint).
    same: u32,
    /// Dense endpoint slot.
    ep: u32,
}

#[derive(Clone, Debug)]
struct Endpoint {
    id: u32,
    head: u32, // most recently used
    tail: u32, // least recently used: evicted first
    len: u32,
    cap: u32,
    live: bool,
}

/// See the module docs. Endpoint ids are the caller's `u32`s.
#[derive(Debug)]
pub struct PrefixIndex {
    nodes: Vec<Node>,
    free: u32,
    table: HashTable<u32>,
    eps: Vec<Endpoint>,
    slot_of: HashMap<u32, u32>,
    free_eps: Vec<u32>,
    default_cap: u32,
    /// Per-slot match counters, kept between calls to avoid an allocation per match.
    scratch: Vec<u32>,
    entries: usize,
}

impl PrefixIndex {
    /// `default_capacity`: entries an endpoint may hold unless [`set_capacity`] says otherwise.
    pub fn new(default_capacity: u32) -> Self {
        PrefixIndex {
            nodes: Vec::new(),
            free: NIL,
            table: HashTable::new(),
            eps: Vec::new(),
            slot_of: HashMap::new(),
            free_eps: Vec::new(),
            default_cap: default_capacity,
            scratch: Vec::new(),
            entries: 0,
        }
    }

    /// Total (block, endpoint) entries.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Entries held by `endpoint` (0 if unknown).
    pub fn endpoint_len(&self, endpoint: u32) -> usize {
        self.slot_of
            .get(&endpoint)
            .map_or(0, |&s| self.eps[s as usize].len as usize)
    }

    /// Known endpoints (inserted or given a capacity, and not removed), in no set order.
    pub fn endpoints(&self) -> Vec<u32> {
        self.slot_of.keys().copied().collect()
    }

    /// Bytes allocated by the index (slab, hash table, endpoint tables).
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

    /// Set `endpoint`'s capacity (registering it), evicting its LRU entries above it.
    pub fn set_capacity(&mut self, endpoint: u32, cap: u32) {
        let s = self.slot(endpoint);
        self.eps[s as usize].cap = cap;
        while self.eps[s as usize].len > cap {
            let t = self.eps[s as usize].tail;
            self.remove_node(t);
        }
    }

    /// First node with `hash`, or NIL.
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

    fn lru_unlink(&mut self, n: u32) {
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

    fn lru_push_front(&mut self, n: u32) {
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

    /// Unlink node `n` from both lists and free it (one table lookup).
    fn remove_node(&mut self, n: u32) {
        self.lru_unlink(n);
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
        if pred != NIL {
            while pred != NIL && self.nodes[pred as usize].same != n {
                pred = self.nodes[pred as usize].same;
            }
            if pred != NIL {
                self.nodes[pred as usize].same = same;
            }
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

    /// Record that `endpoint` holds the chain `hashes` (request dispatched there). Blocks are
    /// touched from the last to the first, so the chain's head ends most recently used and
    /// eviction eats chains from their tails (a lost head would void the whole chain).
    pub fn insert(&mut self, endpoint: u32, hashes: &[u64]) {
        let s = self.slot(endpoint);
        if self.eps[s as usize].cap == 0 {
            return;
        }
        for &h in hashes.iter().rev() {
            let head = self.head_of(h);
            let mut n = head;
            while n != NIL && self.nodes[n as usize].ep != s {
                n = self.nodes[n as usize].same;
            }
            if n != NIL {
                if self.eps[s as usize].head != n {
                    self.lru_unlink(n);
                    self.lru_push_front(n);
                }
                continue;
            }
            // The evicted node belongs to this endpoint, which does not hold `h`: `head`
            // stays valid.
            if self.eps[s as usize].len >= self.eps[s as usize].cap {
                let t = self.eps[s as usize].tail;
                self.remove_node(t);
            }
            let n = self.alloc(Node {
                hash: h,
                prev: NIL,
                next: NIL,
                same: NIL,
                ep: s,
            });
            if head == NIL {
                let nodes = &self.nodes;
                self.table.insert_unique(h, n, |&i| nodes[i as usize].hash);
            } else {
                // Link second in the same-hash list: the table entry need not change.
                self.nodes[n as usize].same = self.nodes[head as usize].same;
                self.nodes[head as usize].same = n;
            }
            self.lru_push_front(n);
            self.eps[s as usize].len += 1;
            self.entries += 1;
        }
    }

    /// Per endpoint, the number of leading blocks of `hashes` it holds, for endpoints with
    /// at least one; order unspecified. Read-only for the LRU (ownership is recorded by
    /// `insert` at dispatch).
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
                if *c == i {
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

    /// Forget `hashes` for `endpoint` (e.g. the engine reported them evicted).
    pub fn evict(&mut self, endpoint: u32, hashes: &[u64]) -> usize {
        let Some(&s) = self.slot_of.get(&endpoint) else {
            return 0;
        };
        let mut removed = 0;
        for &h in hashes {
            let n = self.find_node(s, h);
            if n != NIL {
                self.remove_node(n);
                removed += 1;
            }
        }
        removed
    }

    /// Purge an endpoint that disappeared; returns the entries removed.
    pub fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        let Some(s) = self.slot_of.remove(&endpoint) else {
            return 0;
        };
        let mut removed = 0;
        while self.eps[s as usize].tail != NIL {
            let t = self.eps[s as usize].tail;
            self.remove_node(t);
            removed += 1;
        }
        self.eps[s as usize].live = false;
        self.free_eps.push(s);
        removed
    }

    /// Internal consistency check for tests: every list agrees with the counters.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut total = 0usize;
        for (s, ep) in self.eps.iter().enumerate() {
            if !ep.live {
                assert_eq!(ep.len, 0);
                continue;
            }
            assert_eq!(self.slot_of.get(&ep.id), Some(&(s as u32)));
            let mut n = ep.head;
            let mut prev = NIL;
            let mut len = 0;
            while n != NIL {
                let node = &self.nodes[n as usize];
                assert_eq!(node.ep as usize, s);
                assert_eq!(node.prev, prev);
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
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
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
