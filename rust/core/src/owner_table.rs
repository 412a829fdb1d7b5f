//! Which endpoints hold which `u64` hash, with a per-endpoint recency list and capacity:
//! the structure shared by [`crate::prefix_index`] (payload `()`) and
//! [`crate::kv_ownership`] (payload: a `u32` reference count, endpoint extra: stream down).
//!
//! Layout, chosen for memory (target <= 64 bytes per (hash, endpoint) entry):
//! * one `Node` per entry in a slab (`nodes`, free slots chained through `next`), linked
//!   twice: into its endpoint's recency list (doubly linked, head most recent, so touch and
//!   evict-from-tail are O(1)) and into the singly linked list of the entries with the same
//!   hash (one per endpoint holding it, so short). 24 bytes with payload `()`, 32 with `u32`;
//! * a `hashbrown::HashTable<u32>` from hash to the first node of that same-hash list. It
//!   stores only the node index (4 bytes + 1 control byte per slot): the key is read from
//!   the node, and the hash is used as the table hash directly (it already is one);
//! * endpoints in dense, reused slots, so the per-endpoint match counters and caller state
//!   (which decides whether an endpoint races) sit in one small `Vec` the match loop indexes.
//!
//! A match walks the prompt's chain and, per block, the endpoints holding it; it stops at the
//! first block that no endpoint still in the race holds, so a cache miss costs one lookup.

use hashbrown::{HashMap, HashTable};

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node<P> {
    hash: u64,
    /// Recency neighbours in the endpoint's list (prev = more recent). Free nodes chain via `next`.
    prev: u32,
    next: u32,
    /// Next node with the same hash (another endpoint).
    same: u32,
    /// Dense endpoint slot.
    ep: u32,
    payload: P,
}

#[derive(Clone, Debug)]
struct Endpoint {
    id: u32,
    head: u32, // most recent
    tail: u32, // least recent: evicted first
    len: u32,
    cap: u32,
    live: bool,
}

/// Per-slot match state, apart from `Endpoint` so the match loop reads one small array
/// (for `E = ()` it is a plain `u32` counter).
#[derive(Clone, Copy, Debug, Default)]
struct Race<E> {
    /// Leading blocks matched so far by the running match; 0 between calls.
    count: u32,
    /// Caller's per-endpoint state, read by the match's `racing` predicate.
    extra: E,
}

/// Outcome of [`OwnerTable::touch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Touch {
    /// Already held: moved to the front. The node, for [`OwnerTable::payload_mut`].
    Held(u32),
    /// Added at the front; `evicted` if the endpoint's least recent entry made room.
    Added { evicted: bool },
    /// Not added: the endpoint's capacity is 0.
    NoRoom,
}

/// See the module docs. `P`: per-entry payload; `E`: per-endpoint extra state (reset to
/// `E::default()` when a slot is (re)registered). Endpoint ids are the caller's `u32`s;
/// slots and node indices are internal handles, valid until the entry/endpoint is removed.
#[derive(Debug)]
pub(crate) struct OwnerTable<P: Copy, E: Copy + Default = ()> {
    nodes: Vec<Node<P>>,
    free: u32,
    table: HashTable<u32>,
    eps: Vec<Endpoint>,
    slot_of: HashMap<u32, u32>,
    free_eps: Vec<u32>,
    default_cap: u32,
    /// Per-slot match counters and extra state; kept between calls to avoid an allocation
    /// per match.
    race: Vec<Race<E>>,
    entries: usize,
}

impl<P: Copy, E: Copy + Default> OwnerTable<P, E> {
    pub fn new(default_capacity: u32) -> Self {
        OwnerTable {
            nodes: Vec::new(),
            free: NIL,
            table: HashTable::new(),
            eps: Vec::new(),
            slot_of: HashMap::new(),
            free_eps: Vec::new(),
            default_cap: default_capacity,
            race: Vec::new(),
            entries: 0,
        }
    }

    /// Total (hash, endpoint) entries.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Slot of a known endpoint.
    #[inline]
    pub fn slot_of(&self, endpoint: u32) -> Option<u32> {
        self.slot_of.get(&endpoint).copied()
    }

    /// Entries held by `endpoint` (0 if unknown).
    pub fn endpoint_len(&self, endpoint: u32) -> usize {
        self.slot_of(endpoint)
            .map_or(0, |s| self.eps[s as usize].len as usize)
    }

    /// Known endpoints (registered and not removed), in no set order.
    pub fn endpoints(&self) -> Vec<u32> {
        self.slot_of.keys().copied().collect()
    }

    /// Known endpoints whose extra state satisfies `pred`, in no set order.
    pub fn endpoints_where(&self, pred: impl Fn(&E) -> bool) -> Vec<u32> {
        self.slot_of
            .iter()
            .filter(|(_, &s)| pred(&self.race[s as usize].extra))
            .map(|(&id, _)| id)
            .collect()
    }

    pub fn cap(&self, slot: u32) -> u32 {
        self.eps[slot as usize].cap
    }

    pub fn extra(&self, slot: u32) -> &E {
        &self.race[slot as usize].extra
    }

    pub fn extra_mut(&mut self, slot: u32) -> &mut E {
        &mut self.race[slot as usize].extra
    }

    pub fn payload(&self, node: u32) -> &P {
        &self.nodes[node as usize].payload
    }

    pub fn payload_mut(&mut self, node: u32) -> &mut P {
        &mut self.nodes[node as usize].payload
    }

    /// Bytes allocated (slab, hash table, endpoint tables).
    pub fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node<P>>()
            + self.table.allocation_size()
            + self.eps.capacity() * std::mem::size_of::<Endpoint>()
            + self.slot_of.allocation_size()
            + self.free_eps.capacity() * 4
            + self.race.capacity() * std::mem::size_of::<Race<E>>()
    }

    /// Slot of `endpoint`, registering it (default capacity, default extra) if unknown.
    pub fn slot(&mut self, endpoint: u32) -> u32 {
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
                self.race[s as usize] = Race::default();
                s
            }
            None => {
                self.eps.push(ep);
                self.race.push(Race::default());
                (self.eps.len() - 1) as u32
            }
        };
        self.slot_of.insert(endpoint, s);
        s
    }

    /// Set `endpoint`'s capacity (registering it), evicting its least recent entries above
    /// it. Returns the entries evicted.
    pub fn set_capacity(&mut self, endpoint: u32, cap: u32) -> usize {
        let s = self.slot(endpoint);
        self.eps[s as usize].cap = cap;
        let mut evicted = 0;
        while self.eps[s as usize].len > cap {
            let t = self.eps[s as usize].tail;
            self.remove(t);
            evicted += 1;
        }
        evicted
    }

    /// Hash of `slot`'s least recent entry (the next one a full endpoint evicts).
    #[inline]
    pub fn tail_hash(&self, slot: u32) -> Option<u64> {
        let t = self.eps[slot as usize].tail;
        (t != NIL).then(|| self.nodes[t as usize].hash)
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

    /// The node of (`slot`, `hash`), or NIL; `n` is the first node of the hash's list.
    #[inline]
    fn find_from(&self, mut n: u32, slot: u32) -> u32 {
        while n != NIL && self.nodes[n as usize].ep != slot {
            n = self.nodes[n as usize].same;
        }
        n
    }

    /// The node holding `hash` for `slot`.
    pub fn find(&self, slot: u32, hash: u64) -> Option<u32> {
        let n = self.find_from(self.head_of(hash), slot);
        (n != NIL).then_some(n)
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

    /// Unlink node `n` from both lists and free it (one table lookup).
    pub fn remove(&mut self, n: u32) {
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

    fn alloc(&mut self, node: Node<P>) -> u32 {
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

    /// Make (`slot`, `hash`) the endpoint's most recent entry: move it to the front if held,
    /// else add it with `payload`, evicting the least recent entry if at capacity.
    pub fn touch(&mut self, slot: u32, hash: u64, payload: P) -> Touch {
        let head = self.head_of(hash);
        let n = self.find_from(head, slot);
        let s = slot as usize;
        if n != NIL {
            if self.eps[s].head != n {
                self.list_unlink(n);
                self.list_push_front(n);
            }
            return Touch::Held(n);
        }
        if self.eps[s].cap == 0 {
            return Touch::NoRoom;
        }
        // The evicted node is this endpoint's, which does not hold `hash`: `head` stays valid.
        let evicted = self.eps[s].len >= self.eps[s].cap;
        if evicted {
            let t = self.eps[s].tail;
            self.remove(t);
        }
        let n = self.alloc(Node {
            hash,
            prev: NIL,
            next: NIL,
            same: NIL,
            ep: slot,
            payload,
        });
        if head == NIL {
            let nodes = &self.nodes;
            self.table
                .insert_unique(hash, n, |&i| nodes[i as usize].hash);
        } else {
            // Link second in the same-hash list: the table entry need not change.
            self.nodes[n as usize].same = self.nodes[head as usize].same;
            self.nodes[head as usize].same = n;
        }
        self.list_push_front(n);
        self.eps[s].len += 1;
        self.entries += 1;
        Touch::Added { evicted }
    }

    /// Remove all of `slot`'s entries (it stays registered); returns how many.
    pub fn clear_slot(&mut self, slot: u32) -> usize {
        let mut removed = 0;
        while self.eps[slot as usize].tail != NIL {
            let t = self.eps[slot as usize].tail;
            self.remove(t);
            removed += 1;
        }
        removed
    }

    /// Unregister `endpoint` and free its slot; returns the entries removed.
    pub fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        let Some(s) = self.slot_of.remove(&endpoint) else {
            return 0;
        };
        let removed = self.clear_slot(s);
        self.eps[s as usize].live = false;
        self.free_eps.push(s);
        removed
    }

    /// Hashes held by `endpoint`, most recent first.
    pub fn endpoint_hashes(&self, endpoint: u32) -> Vec<u64> {
        let mut v = Vec::new();
        if let Some(s) = self.slot_of(endpoint) {
            let mut n = self.eps[s as usize].head;
            while n != NIL {
                v.push(self.nodes[n as usize].hash);
                n = self.nodes[n as usize].next;
            }
        }
        v
    }

    /// Per endpoint whose extra state passes `racing`, the number of leading blocks of
    /// `hashes` it holds (endpoints with at least one; order unspecified). Read-only but
    /// for the match counters, which it leaves zeroed.
    #[inline]
    pub fn match_hashes(
        &mut self,
        hashes: &[u64],
        out: &mut Vec<(u32, u32)>,
        racing: impl Fn(&E) -> bool,
    ) {
        out.clear();
        let mut touched: Vec<u32> = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            let i = i as u32;
            let mut n = self.head_of(h);
            let mut advanced = false;
            while n != NIL {
                let node = &self.nodes[n as usize];
                let r = &mut self.race[node.ep as usize];
                if r.count == i && racing(&r.extra) {
                    r.count = i + 1;
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
            let r = &mut self.race[s as usize];
            out.push((self.eps[s as usize].id, r.count));
            r.count = 0;
        }
    }

    /// Internal consistency check for tests: every list agrees with the counters, and every
    /// live payload passes `payload_ok`.
    pub fn check_invariants(&self, payload_ok: impl Fn(&P) -> bool) {
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
                assert!(payload_ok(&node.payload));
                assert_eq!(self.find(s as u32, node.hash), Some(n));
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
        assert!(self.race.iter().all(|r| r.count == 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_sizes_fit_the_memory_target() {
        assert_eq!(std::mem::size_of::<Node<()>>(), 24);
        assert_eq!(std::mem::size_of::<Node<u32>>(), 32);
        // PrefixIndex's match state stays a bare counter.
        assert_eq!(std::mem::size_of::<Race<()>>(), 4);
    }

    #[test]
    fn touch_evicts_least_recent_and_unlinks_same_hash_lists() {
        let mut t: OwnerTable<u32> = OwnerTable::new(2);
        let (a, b, c) = (t.slot(1), t.slot(2), t.slot(3));
        for s in [a, b, c] {
            assert_eq!(t.touch(s, 7, s), Touch::Added { evicted: false });
        }
        // Same-hash list: 7 held by three endpoints; removing the middle one keeps the rest.
        let nb = t.find(b, 7).unwrap();
        assert_eq!(*t.payload(nb), b);
        t.remove(nb);
        assert_eq!(
            (t.find(a, 7).is_some(), t.find(b, 7), t.find(c, 7).is_some()),
            (true, None, true)
        );
        t.check_invariants(|_| true);
        // Recency: 8 then 7 is touched, so 8 is least recent and makes room for 9.
        assert_eq!(t.touch(a, 8, 0), Touch::Added { evicted: false });
        let na = t.find(a, 7).unwrap();
        assert_eq!(t.touch(a, 7, 0), Touch::Held(na));
        assert_eq!(t.touch(a, 9, 0), Touch::Added { evicted: true });
        assert_eq!(t.endpoint_hashes(1), vec![9, 7]);
        assert_eq!(t.set_capacity(1, 0), 2);
        assert_eq!(t.touch(a, 9, 0), Touch::NoRoom);
        assert_eq!(t.len(), 1);
        t.check_invariants(|_| true);
    }

    #[test]
    fn slot_reuse_resets_extra_and_match_skips_non_racing() {
        let mut t: OwnerTable<(), bool> = OwnerTable::new(10);
        for ep in [1, 2] {
            let s = t.slot(ep);
            for h in [1, 2, 3] {
                t.touch(s, h, ());
            }
        }
        let s1 = t.slot_of(1).unwrap();
        *t.extra_mut(s1) = true;
        let mut out = Vec::new();
        t.match_hashes(&[1, 2, 4], &mut out, |&x| !x);
        assert_eq!(out, vec![(2, 2)]);
        assert_eq!(t.endpoints_where(|&x| x), vec![1]);
        assert_eq!(t.remove_endpoint(1), 3);
        let s5 = t.slot(5);
        assert_eq!((s5, *t.extra(s5), t.endpoint_len(5)), (s1, false, 0));
        t.check_invariants(|_| true);
    }
}
