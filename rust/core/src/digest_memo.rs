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
//! Recent chains: the memo also keeps the token ids and digests of the last
//! [`RECENT_CHAINS`] chains hashed (each of at most `capacity` blocks). A prompt whose
//! leading blocks equal a recent chain's (compared with memcmp, same block size and same
//! `tag`, which names the root and extra keys) takes their digests without a probe per
//! block: this is exact, since a chain digest is a function of the root, the extra keys
//! and all the tokens up to it. The longest such chain is then updated in place (cut at
//! the first differing block, extended with the new blocks).
//!
//! Memory: two generations of at most `capacity / 2` entries each (48 bytes + a control
//! byte per entry), plus the recent chains (36 bytes per block at 16 tokens a block).
//! Inserts go to the current generation; when it is full the previous one is dropped and
//! the current becomes the previous; a hit in the previous one is copied into the current.
//! That keeps the recently used blocks (an approximate LRU) at O(1) per probe.

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_128;

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: u128,
    digest: [u8; 32],
}

/// Chains remembered whole (see the module docs).
pub const RECENT_CHAINS: usize = 4;

#[derive(Debug)]
struct Chain {
    tag: Vec<u8>,
    block_size: usize,
    tokens: Vec<u32>, // whole blocks only
    digests: Vec<[u8; 32]>,
}

/// Leading blocks of `block_size` tokens equal in `a` and `b` (memcmp in strides).
fn common_blocks(a: &[u32], b: &[u32], block_size: usize) -> usize {
    const STRIDE: usize = 64; // blocks per comparison before going block by block
    let n = a.len().min(b.len()) / block_size;
    let same = |i: usize, k: usize| {
        a[i * block_size..(i + k) * block_size] == b[i * block_size..(i + k) * block_size]
    };
    let mut i = 0;
    while i + STRIDE <= n && same(i, STRIDE) {
        i += STRIDE;
    }
    while i < n && same(i, 1) {
        i += 1;
    }
    i
}

/// A recent chain sharing leading blocks with a prompt: [`DigestMemo::recent_prefix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPrefix {
    chain: usize,
    /// Leading blocks whose digests the chain holds.
    pub blocks: usize,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct DigestMemo {
    cur: HashTable<Slot>,
    prev: HashTable<Slot>,
    chains: Vec<Chain>, // most recent first
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

    /// Blocks served from the memo (recent chains included) / hashed, since creation.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }

    pub fn clear(&mut self) {
        self.cur.clear();
        self.prev.clear();
        self.chains.clear();
    }

    /// The recent chain (same `tag` and block size) sharing the most leading blocks with
    /// `tokens`, if any shares one.
    pub fn recent_prefix(
        &self,
        tag: &[u8],
        block_size: usize,
        tokens: &[u32],
    ) -> Option<SharedPrefix> {
        let mut best: Option<SharedPrefix> = None;
        for (i, c) in self.chains.iter().enumerate() {
            if c.block_size != block_size || c.tag != tag {
                continue;
            }
            let blocks = common_blocks(&c.tokens, tokens, block_size);
            if blocks > best.map_or(0, |b| b.blocks) {
                best = Some(SharedPrefix { chain: i, blocks });
            }
        }
        best
    }

    /// The digests of a shared prefix's blocks.
    pub fn prefix_digests(&self, p: SharedPrefix) -> &[[u8; 32]] {
        &self.chains[p.chain].digests[..p.blocks]
    }

    /// Remember the chain just hashed: `tokens` (whole blocks) with the digests of the
    /// blocks after `shared` (from [`Self::recent_prefix`] for the same tag and tokens).
    pub fn remember_chain(
        &mut self,
        tag: &[u8],
        block_size: usize,
        tokens: &[u32],
        shared: Option<SharedPrefix>,
        new_digests: &[[u8; 32]],
    ) {
        self.hits += shared.map_or(0, |p| p.blocks as u64);
        let blocks = tokens.len() / block_size;
        if self.half == 0 || block_size == 0 || blocks > self.capacity() {
            return;
        }
        let chain = match shared {
            Some(p) => {
                let mut c = self.chains.remove(p.chain);
                if blocks > p.blocks || c.digests.len() < blocks {
                    c.tokens.truncate(p.blocks * block_size);
                    c.tokens
                        .extend_from_slice(&tokens[p.blocks * block_size..blocks * block_size]);
                    c.digests.truncate(p.blocks);
                    c.digests.extend_from_slice(new_digests);
                } // else: a prefix of the remembered chain, which stays whole
                c
            }
            None => Chain {
                tag: tag.to_vec(),
                block_size,
                tokens: tokens[..blocks * block_size].to_vec(),
                digests: new_digests.to_vec(),
            },
        };
        debug_assert_eq!(chain.tokens.len(), chain.digests.len() * block_size);
        self.chains.insert(0, chain);
        self.chains.truncate(RECENT_CHAINS);
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
    fn recent_chains_share_prefixes() {
        let d = |i: u32| fake(&i.to_le_bytes());
        let mut m = DigestMemo::new(100);
        let a: Vec<u32> = (0..40).collect();
        assert_eq!(m.recent_prefix(b"t", 4, &a), None);
        m.remember_chain(b"t", 4, &a, None, &(0..10).map(d).collect::<Vec<_>>());
        let mut b = a[..22].to_vec();
        b.extend([99; 10]);
        let p = m.recent_prefix(b"t", 4, &b).unwrap();
        assert_eq!(p.blocks, 5); // blocks 0..5 equal, block 5 (tokens 20..24) differs
        assert_eq!(m.prefix_digests(p), &(0..5).map(d).collect::<Vec<_>>()[..]);
        assert_eq!(m.recent_prefix(b"u", 4, &b), None); // another tag (root, LoRA)
        assert_eq!(m.recent_prefix(b"t", 8, &b), None); // another block size
        m.remember_chain(b"t", 4, &b, Some(p), &[d(50), d(51), d(52)]);
        let p = m.recent_prefix(b"t", 4, &b).unwrap();
        assert_eq!(p.blocks, 8);
        assert_eq!(m.prefix_digests(p)[5..], [d(50), d(51), d(52)]);
        // a prefix of a remembered chain leaves it whole
        m.remember_chain(b"t", 4, &b[..8], m.recent_prefix(b"t", 4, &b[..8]), &[]);
        assert_eq!(m.recent_prefix(b"t", 4, &b).unwrap().blocks, 8);
        for i in 0..10u32 {
            let other: Vec<u32> = (1000 * (i + 1)..1000 * (i + 1) + 8).collect();
            m.remember_chain(b"t", 4, &other, None, &[d(i), d(i)]);
        }
        assert_eq!(m.chains.len(), RECENT_CHAINS);
        // long strides: equal for 70 blocks of 1 token
        let long: Vec<u32> = (0..100).collect();
        let mut long2 = long.clone();
        long2[70] = 7;
        assert_eq!(common_blocks(&long, &long2, 1), 70);
        assert_eq!(common_blocks(&long, &long, 1), 100);
        m.clear();
        assert!(m.chains.is_empty());
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
