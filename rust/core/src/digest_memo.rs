//! Memo of block digests: sha256 input -> sha256 output, so that a prompt sharing a
//! prefix with an earlier one does not hash the shared blocks again.
//!
//! vLLM's chain (`crate::token_hash::VllmSha256Cbor`) hashes, per block, the CBOR of
//! `(parent digest, block tokens, extra keys)`. The caller passes a key that determines
//! those bytes (the raw parent, tokens and extra keys with the block length); the memo is
//! keyed by its xxh3-128, so a hit returns the digest sha256 would return for the block (up
//! to a 128-bit fingerprint collision, far below the 64-bit event keys' own collision
//! rate). No reasoning about prefixes is needed: any reuse (shared system prompt,
//! multi-turn extension, retries) is found block by block. A probe (key bytes, one xxh3,
//! one table lookup) costs a fraction of the CBOR encoding plus sha256 it replaces.
//!
//! Memory: two generations of at most `capacity / 2` entries each (48 bytes + a control
//! byte per entry). Inserts go to the current one; when it is full the previous one is
//! dropped and the current becomes the previous; a hit in the previous one is copied into
//! the current. That keeps the recently used blocks (an approximate LRU) at O(1) per probe.

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_128;

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: u128,
    digest: [u8; 32],
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct DigestMemo {
    cur: HashTable<Slot>,
    prev: HashTable<Slot>,
    /// Entries per generation; 0 disables the memo.
    half: usize,
    hits: u64,
    misses: u64,
}

fn table_hash(key: u128) -> u64 {
    key as u64 // already a hash
}

impl DigestMemo {
    /// At most `capacity` entries (0: no memo, every block is hashed).
    pub fn new(capacity: usize) -> Self {
        DigestMemo {
            half: capacity / 2,
            ..Default::default()
        }
    }

    pub fn capacity(&self) -> usize {
        self.half * 2
    }

    pub fn len(&self) -> usize {
        self.cur.len() + self.prev.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks served from the memo / hashed, since creation.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }

    pub fn clear(&mut self) {
        self.cur.clear();
        self.prev.clear();
    }

    /// The digest of the block identified by `input` (bytes that determine what the
    /// digest is computed over), from the memo or from `hash`, which is remembered.
    pub fn digest(&mut self, input: &[u8], hash: impl FnOnce() -> [u8; 32]) -> [u8; 32] {
        if self.half == 0 {
            return hash();
        }
        let key = xxh3_128(input);
        let h = table_hash(key);
        if let Some(s) = self.cur.find(h, |s| s.key == key) {
            self.hits += 1;
            return s.digest;
        }
        let digest = match self.prev.find(h, |s| s.key == key) {
            Some(s) => {
                self.hits += 1;
                s.digest
            }
            None => {
                self.misses += 1;
                hash()
            }
        };
        if self.cur.len() >= self.half {
            self.prev = std::mem::take(&mut self.cur);
        }
        self.cur
            .insert_unique(h, Slot { key, digest }, |s| table_hash(s.key));
        digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(input: &[u8]) -> [u8; 32] {
        let mut d = [0u8; 32];
        d[..input.len().min(32)].copy_from_slice(&input[..input.len().min(32)]);
        d[31] ^= input.len() as u8;
        d
    }

    #[test]
    fn hits_return_what_the_hash_returned() {
        let mut m = DigestMemo::new(8);
        let a = m.digest(b"block a", || fake(b"block a"));
        let b = m.digest(b"block b", || fake(b"block b"));
        assert_eq!((m.hits(), m.misses()), (0, 2));
        assert_eq!(m.digest(b"block a", || unreachable!()), a);
        assert_eq!(m.digest(b"block b", || unreachable!()), b);
        assert_eq!((m.hits(), m.misses(), m.len()), (2, 2, 2));
    }

    #[test]
    fn bounded_and_keeps_recent_entries() {
        let mut m = DigestMemo::new(4);
        for i in 0u32..100 {
            m.digest(&i.to_le_bytes(), || fake(&i.to_le_bytes()));
            assert!(m.len() <= 4);
            // the block just before is always still there (current or previous generation)
            if i > 0 {
                let k = (i - 1).to_le_bytes();
                assert_eq!(m.digest(&k, || unreachable!()), fake(&k));
            }
        }
        m.clear();
        assert!(m.is_empty());
    }

    #[test]
    fn zero_capacity_always_hashes() {
        let mut m = DigestMemo::new(0);
        let mut calls = 0;
        for _ in 0..3 {
            m.digest(b"x", || {
                calls += 1;
                fake(b"x")
            });
        }
        assert_eq!((calls, m.len()), (3, 0));
    }
}
