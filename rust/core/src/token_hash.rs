//! Chained block hashes of token ids, as an engine computes them for its prefix cache.
//!
//! Engines differ (vLLM: sha256 over a pickled/CBOR `(parent, tokens, extra_keys)`; the
//! simulator: CPython's tuple hash; SGLang: its own), so the block function is pluggable
//! ([`TokenBlockHasher`]); everything downstream (the ownership table) only sees `u64`s.
//! The chain is
//!
//! ```text
//! h_i = hash_block(h_{i-1}, tokens[i*B .. (i+1)*B]),   h_{-1} = root
//! ```
//!
//! where `root` encodes what the engine puts in front of the first block (the model's or
//! LoRA adapter's root value): the caller supplies it. Only full blocks are hashed, as
//! engines only cache full blocks.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// One block of the chain: `parent` is the previous block's hash (or the root).
pub trait TokenBlockHasher {
    fn hash_block(&self, parent: u64, tokens: &[u32]) -> u64;
}

/// Our default: `xxh3_64_with_seed(le64(parent) || le32(t_0) || le32(t_1) ..., seed)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Xxh3Tokens {
    pub seed: u64,
}

impl TokenBlockHasher for Xxh3Tokens {
    fn hash_block(&self, parent: u64, tokens: &[u32]) -> u64 {
        // Usual block sizes (<= 62 tokens) hash from the stack: no allocation per block.
        let mut stack = [0u8; 256];
        let mut heap = Vec::new();
        let n = 8 + 4 * tokens.len();
        let buf: &mut [u8] = if n <= stack.len() {
            &mut stack[..n]
        } else {
            heap.resize(n, 0);
            &mut heap
        };
        buf[..8].copy_from_slice(&parent.to_le_bytes());
        for (c, t) in buf[8..].chunks_exact_mut(4).zip(tokens) {
            c.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(buf, self.seed)
    }
}

/// The simulator's scheme: CPython's `hash((parent, tuple(tokens))) & (2**64 - 1)` on a
/// 64-bit build (tuple hash = xxHash-style lanes since Python 3.8; int hash = value mod
/// 2**61 - 1). Deterministic: ints and tuples are not salted by PYTHONHASHSEED.
#[derive(Clone, Copy, Debug, Default)]
pub struct CPythonTuple;

const XXPRIME_1: u64 = 11400714785074694791;
const XXPRIME_2: u64 = 14029467366897019727;
const XXPRIME_5: u64 = 2870177450012600261;
const PY_MODULUS: u64 = (1 << 61) - 1;

/// CPython's `tuplehash` over already-hashed items.
fn py_tuple_hash(lanes: impl ExactSizeIterator<Item = u64>) -> u64 {
    let len = lanes.len() as u64;
    let mut acc = XXPRIME_5;
    for lane in lanes {
        acc = acc.wrapping_add(lane.wrapping_mul(XXPRIME_2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(XXPRIME_1);
    }
    acc = acc.wrapping_add(len ^ (XXPRIME_5 ^ 3527539));
    if acc == u64::MAX {
        1546275796 // CPython reserves -1 for errors
    } else {
        acc
    }
}

impl TokenBlockHasher for CPythonTuple {
    fn hash_block(&self, parent: u64, tokens: &[u32]) -> u64 {
        // hash(int) of a non-negative int is the value mod 2**61 - 1 (never -1).
        let inner = py_tuple_hash(tokens.iter().map(|&t| u64::from(t) % PY_MODULUS));
        py_tuple_hash([parent % PY_MODULUS, inner].into_iter())
    }
}

/// The schemes selectable by name (configuration and the Python binding).
#[derive(Clone, Copy, Debug)]
pub enum HashScheme {
    Xxh3(Xxh3Tokens),
    CPythonTuple,
}

impl HashScheme {
    /// `"xxh3"` (seed 0) or `"cpython-tuple"` (the simulator's).
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "xxh3" => Some(HashScheme::Xxh3(Xxh3Tokens { seed: 0 })),
            "cpython-tuple" => Some(HashScheme::CPythonTuple),
            _ => None,
        }
    }
}

impl TokenBlockHasher for HashScheme {
    fn hash_block(&self, parent: u64, tokens: &[u32]) -> u64 {
        match self {
            HashScheme::Xxh3(h) => h.hash_block(parent, tokens),
            HashScheme::CPythonTuple => CPythonTuple.hash_block(parent, tokens),
        }
    }
}

/// Append the chain hashes of at most `max_blocks` full blocks of `tokens` to `out`.
/// `block_size == 0` hashes nothing.
pub fn chain_token_hashes<H: TokenBlockHasher + ?Sized>(
    hasher: &H,
    root: u64,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
    out: &mut Vec<u64>,
) {
    if block_size == 0 {
        return;
    }
    let n = (tokens.len() / block_size).min(max_blocks);
    out.reserve(n);
    let mut prev = root;
    for block in tokens.chunks_exact(block_size).take(n) {
        prev = hasher.hash_block(prev, block);
        out.push(prev);
    }
}

/// Key of an engine block hash given as bytes (vLLM >= 0.10 sends 32-byte sha256 digests
/// unless `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` is set): the low 64 bits of the big-endian
/// integer, i.e. the last 8 bytes, which is exactly what vLLM's int mode sends, so both
/// modes give the same key. Shorter inputs are zero-extended on the left.
pub fn block_hash_key(bytes: &[u8]) -> u64 {
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    let mut b = [0u8; 8];
    b[8 - tail.len()..].copy_from_slice(tail);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain<H: TokenBlockHasher>(h: &H, root: u64, t: &[u32], bs: usize) -> Vec<u64> {
        let mut v = Vec::new();
        chain_token_hashes(h, root, t, bs, usize::MAX, &mut v);
        v
    }

    #[test]
    fn cpython_tuple_hash_known_values() {
        // Values printed by CPython 3.11: hash(()) and hash((1, 2)) and the simulator's
        // hash((7, (1, 2, 3))) & MASK64.
        assert_eq!(py_tuple_hash([].into_iter()), 5740354900026072187);
        assert_eq!(
            py_tuple_hash([1u64, 2].into_iter()),
            (-3550055125485641917i64) as u64
        );
        assert_eq!(CPythonTuple.hash_block(7, &[1, 2, 3]), 4160776674258785373);
    }

    #[test]
    fn chain_shares_prefix_then_diverges() {
        for scheme in [
            HashScheme::by_name("xxh3").unwrap(),
            HashScheme::CPythonTuple,
        ] {
            let a: Vec<u32> = (0..40).collect();
            let mut b = a.clone();
            b[20] = 999;
            let (ha, hb) = (chain(&scheme, 5, &a, 8), chain(&scheme, 5, &b, 8));
            assert_eq!(ha.len(), 5); // 40 / 8, no partial block
            assert_eq!(ha[..2], hb[..2]);
            assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
            assert_ne!(chain(&scheme, 6, &a, 8)[0], ha[0]); // root separates adapters
        }
    }

    #[test]
    fn xxh3_definition_small_and_large_blocks() {
        for n in [1usize, 16, 62, 63, 200] {
            let toks: Vec<u32> = (0..n as u32).map(|i| i * 7919).collect();
            let mut buf = 9u64.to_le_bytes().to_vec();
            toks.iter()
                .for_each(|t| buf.extend_from_slice(&t.to_le_bytes()));
            assert_eq!(
                Xxh3Tokens { seed: 3 }.hash_block(9, &toks),
                xxh3_64_with_seed(&buf, 3)
            );
        }
    }

    #[test]
    fn limits_and_bytes_keys() {
        let mut v = Vec::new();
        chain_token_hashes(&CPythonTuple, 0, &[1, 2, 3], 0, 9, &mut v);
        chain_token_hashes(&CPythonTuple, 0, &[1, 2, 3], 2, 0, &mut v);
        assert!(v.is_empty());
        assert_eq!(
            block_hash_key(
                &[0xAA; 24]
                    .iter()
                    .chain(&[0, 0, 0, 0, 0, 0, 1, 2])
                    .copied()
                    .collect::<Vec<_>>()
            ),
            0x0102
        );
        assert_eq!(block_hash_key(&[1, 2]), 0x0102);
        assert_eq!(block_hash_key(&[]), 0);
    }
}
