//! Which prompt prefixes are shared: a block that two different blocks have followed ends a
//! prefix that several prompts continue differently (a group's system prompt, a RAG
//! document). A session's growing context does not branch, since each turn extends the
//! last, so its blocks are never marked.
//!
//! Each block hash maps to a fingerprint of the block seen after it, or to [`BRANCHED`]
//! once a different one has followed. Memory is bounded by two generations of at most
//! `generation` entries each: a lookup moves an entry into the young one, and a full young
//! generation becomes the old one, dropping the previous old one. So a prefix that keeps
//! being asked for stays, and one not seen for two generations of new blocks is forgotten.

use hashbrown::HashMap;

const BRANCHED: u64 = 0;

fn fingerprint(h: u64) -> u64 {
    if h == BRANCHED {
        1
    } else {
        h
    }
}

pub struct BranchPoints {
    young: HashMap<u64, u64>,
    old: HashMap<u64, u64>,
    generation: usize,
}

impl BranchPoints {
    /// `generation`: entries per generation (at least 1).
    pub fn new(generation: usize) -> Self {
        BranchPoints { young: HashMap::new(), old: HashMap::new(), generation: generation.max(1) }
    }

    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records one prompt's chain and returns, ascending, the block counts of its prefixes
    /// whose last block has branched (this prompt's own continuation included).
    pub fn observe(&mut self, hashes: &[u64]) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            let next = hashes.get(i + 1).map(|&n| fingerprint(n));
            let seen = self.take(h);
            let now = match (seen, next) {
                (None, next) => next,
                (Some(s), None) => Some(s),
                (Some(s), Some(n)) => Some(if s == n { s } else { BRANCHED }),
            };
            if let Some(v) = now {
                self.put(h, v);
                if v == BRANCHED {
                    out.push(i as u32 + 1);
                }
            }
        }
        out
    }

    fn take(&mut self, h: u64) -> Option<u64> {
        self.young.get(&h).copied().or_else(|| self.old.remove(&h))
    }

    fn put(&mut self, h: u64, v: u64) {
        if self.young.insert(h, v).is_none() && self.young.len() >= self.generation {
            self.old = std::mem::take(&mut self.young);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_continued_two_ways_branches_and_an_extended_one_does_not() {
        let mut b = BranchPoints::new(1 << 10);
        assert!(b.observe(&[10, 20, 30, 40]).is_empty());
        assert_eq!(b.observe(&[10, 20, 30, 41]), vec![3]); // 30 was followed by 40, now 41
        assert_eq!(b.observe(&[10, 20, 30, 42, 50]), vec![3]);
        assert_eq!(b.observe(&[10, 21]), vec![1]);
        // a session: each turn extends the previous prompt, nothing branches
        let mut s = BranchPoints::new(1 << 10);
        assert!(s.observe(&[1, 2, 3]).is_empty());
        assert!(s.observe(&[1, 2, 3, 4, 5]).is_empty());
        assert!(s.observe(&[1, 2, 3, 4, 5, 6, 7]).is_empty());
        // the whole prompt is a shared prefix: its last block counts
        assert_eq!(b.observe(&[10, 20, 30]), vec![1, 3]);
    }

    #[test]
    fn a_zero_hash_successor_still_differs_from_branched() {
        let mut b = BranchPoints::new(16);
        assert!(b.observe(&[7, 0]).is_empty());
        assert!(b.observe(&[7, 0, 9]).is_empty()); // same successor (0): not branched
        assert_eq!(b.observe(&[7, 8]), vec![1]);
    }

    #[test]
    fn memory_is_two_generations_and_lookups_keep_an_entry_young() {
        let mut b = BranchPoints::new(4);
        b.observe(&[100, 1]);
        b.observe(&[100, 2]); // 100 branched
        for k in 0..20u64 {
            b.observe(&[1000 + k, 1]); // new blocks, one entry each
            assert!(b.len() <= 8);
            assert_eq!(b.observe(&[100]), vec![1]); // asked for again: kept
        }
        for k in 0..8u64 {
            b.observe(&[5000 + k, 1]);
        }
        assert!(b.observe(&[100]).is_empty()); // two generations without it: forgotten
    }

    #[test]
    fn matches_a_naive_model_on_random_chains() {
        use std::collections::HashMap as Naive;
        let mut b = BranchPoints::new(usize::MAX >> 1);
        let mut succ: Naive<u64, Option<u64>> = Naive::new(); // None: branched
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 6) as usize;
            // chains over a small alphabet so that prefixes recur and branch
            let chain: Vec<u64> = (0..len).map(|i| 2 + ((x >> (8 * i)) % 3) + 10 * i as u64).collect();
            let mut want = Vec::new();
            for i in 0..len {
                let next = chain.get(i + 1).copied();
                let e = match (succ.get(&chain[i]).copied(), next) {
                    (None, None) => None,
                    (None, Some(n)) => Some(Some(n)),
                    (Some(s), None) => Some(s),
                    (Some(None), Some(_)) => Some(None),
                    (Some(Some(s)), Some(n)) => Some(if s == n { Some(s) } else { None }),
                };
                if let Some(v) = e {
                    succ.insert(chain[i], v);
                    if v.is_none() {
                        want.push(i as u32 + 1);
                    }
                }
            }
            assert_eq!(b.observe(&chain), want);
        }
    }
}
