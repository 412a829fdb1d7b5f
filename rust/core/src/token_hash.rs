//! Chained block hashes of token ids, as an engine computes them for its prefix cache.
//!
//! Engines differ (vLLM: sha256 over a pickled/CBOR `(parent, tokens, extra_keys)`;
//! SGLang: its own), so the scheme is selectable ([`HashScheme`]); everything downstream
//! (the ownership table) only sees `u64`s. vLLM's sha256_cbor is [`VllmSha256Cbor`]
//! (reference: kthena_router/kv_events/hashing.py).
//! The chain is
//!
//! ```text
//! h_i = hash_block(h_{i-1}, tokens[i*B .. (i+1)*B]),   h_{-1} = root
//! ```
//!
//! where `root` encodes what the engine puts in front of the first block (the model's or
//! LoRA adapter's root value): the caller supplies it. Only full blocks are hashed, as
//! engines only cache full blocks.

use crate::digest_memo::DigestMemo;
use sha2::{Digest, Sha256};
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

/// vLLM's `hash_block_tokens` with `--prefix-caching-hash-algo sha256_cbor`:
///
/// ```text
/// digest_i = sha256(cbor((digest_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys)))
/// NONE_HASH = sha256(cbor(PYTHONHASHSEED as a string))
/// ```
///
/// with cbor2's canonical encoding (shortest heads), `extra_keys` = `(lora_name,)` for a
/// LoRA request, else None. The chain carries the full 32-byte digest; the hash an event
/// carries (and the table keys) is its last 8 bytes, big-endian.
#[derive(Clone, Copy, Debug)]
pub struct VllmSha256Cbor {
    pub none_hash: [u8; 32],
}

/// Canonical CBOR item head (major type, shortest argument).
#[inline]
fn cbor_head(major: u8, n: u64, out: &mut Vec<u8>) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n <= 0xFF {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= 0xFFFF {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= 0xFFFF_FFFF {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

const CBOR_BYTES: u8 = 2;
const CBOR_TEXT: u8 = 3;
const CBOR_ARRAY: u8 = 4;
const CBOR_NULL: u8 = 0xF6;

impl VllmSha256Cbor {
    /// `hash_seed`: the engines' PYTHONHASHSEED (vLLM's NONE_HASH is random without one).
    pub fn new(hash_seed: &str) -> Self {
        let mut buf = Vec::with_capacity(hash_seed.len() + 9);
        cbor_head(CBOR_TEXT, hash_seed.len() as u64, &mut buf);
        buf.extend_from_slice(hash_seed.as_bytes());
        VllmSha256Cbor {
            none_hash: Sha256::digest(&buf).into(),
        }
    }

    /// Append the event hashes of at most `max_blocks` full blocks of `tokens` to `out`.
    pub fn chain(
        &self,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
        lora: Option<&str>,
        out: &mut Vec<u64>,
    ) {
        self.chain_memo(tokens, block_size, max_blocks, lora, None, out);
    }

    /// [`Self::chain`], taking each block's digest from `memo` when the same (parent,
    /// tokens, extra keys) was hashed before (and remembering the new ones).
    pub fn chain_memo(
        &self,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
        lora: Option<&str>,
        memo: Option<&mut DigestMemo>,
        out: &mut Vec<u64>,
    ) {
        if block_size == 0 {
            return;
        }
        let mut memo = memo.filter(|m| m.capacity() > 0); // no key building for nothing
        let n = (tokens.len() / block_size).min(max_blocks);
        out.reserve(n);
        // The key is rebuilt in one buffer: only the parent digest and tokens change.
        let mut tail = Vec::new();
        match lora {
            None => tail.push(CBOR_NULL),
            Some(name) => {
                cbor_head(CBOR_ARRAY, 1, &mut tail);
                cbor_head(CBOR_TEXT, name.len() as u64, &mut tail);
                tail.extend_from_slice(name.as_bytes());
            }
        }
        let mut buf = Vec::with_capacity(40 + 5 * block_size + tail.len());
        // Memo key: le32(block length) || parent || le32 tokens || tail, which determines
        // the CBOR bytes (so equal keys mean equal sha256 inputs) and is cheaper to build.
        let mut key = Vec::with_capacity(36 + 4 * block_size + tail.len());
        let mut parent = self.none_hash;
        let tokens = &tokens[..n * block_size];
        // Leading blocks shared with a recent chain of the same root and extra keys.
        let mut tag = Vec::new();
        let mut shared = None;
        let mut start = 0;
        if let Some(m) = memo.as_deref() {
            tag.extend_from_slice(&self.none_hash);
            tag.extend_from_slice(&tail);
            shared = m.recent_prefix(&tag, block_size, tokens);
            if let Some(p) = shared {
                let digests = m.prefix_digests(p);
                out.extend(digests.iter().map(|d| block_hash_key(d)));
                parent = digests[p.blocks - 1];
                start = p.blocks;
            }
        }
        let mut new_digests = Vec::new();
        for block in tokens[start * block_size..].chunks_exact(block_size) {
            let cbor = |buf: &mut Vec<u8>| -> [u8; 32] {
                buf.clear();
                cbor_head(CBOR_ARRAY, 3, buf);
                cbor_head(CBOR_BYTES, 32, buf);
                buf.extend_from_slice(&parent);
                cbor_head(CBOR_ARRAY, block.len() as u64, buf);
                for &t in block {
                    cbor_head(0, u64::from(t), buf);
                }
                buf.extend_from_slice(&tail);
                Sha256::digest(&*buf).into()
            };
            parent = match memo.as_deref_mut() {
                Some(m) => {
                    key.clear();
                    key.extend_from_slice(&(block.len() as u32).to_le_bytes());
                    key.extend_from_slice(&parent);
                    for &t in block {
                        key.extend_from_slice(&t.to_le_bytes());
                    }
                    key.extend_from_slice(&tail);
                    let d = m.digest(&key, || cbor(&mut buf));
                    new_digests.push(d);
                    d
                }
                None => cbor(&mut buf),
            };
            out.push(block_hash_key(&parent));
        }
        if let Some(m) = memo {
            m.remember_chain(&tag, block_size, tokens, shared, &new_digests);
        }
    }
}

/// The schemes selectable by name (configuration and the Python binding). Only published
/// algorithms: an engine's private hash (e.g. the simulator's internal one) never belongs
/// here, the router must reproduce what a real engine computes.
#[derive(Clone, Copy, Debug)]
pub enum HashScheme {
    /// Ours (tests, engines without a published scheme): chained through `root`, no LoRA
    /// key (fold the adapter into `root`).
    Xxh3(Xxh3Tokens),
    /// vLLM's sha256_cbor (`root` unused: the chain starts at NONE_HASH; LoRA in the key).
    VllmSha256Cbor(VllmSha256Cbor),
}

impl HashScheme {
    /// `"xxh3"` (seed 0) or `"vllm-sha256-cbor"` with the engines' hash seed.
    pub fn by_name(name: &str, hash_seed: &str) -> Option<Self> {
        match name {
            "xxh3" => Some(HashScheme::Xxh3(Xxh3Tokens { seed: 0 })),
            "vllm-sha256-cbor" => Some(HashScheme::VllmSha256Cbor(VllmSha256Cbor::new(hash_seed))),
            _ => None,
        }
    }

    /// Append the chain's hashes of at most `max_blocks` full blocks to `out`, with a
    /// digest memo for the schemes it pays off for (vLLM's sha256; xxh3 is cheaper than a
    /// probe and ignores it).
    #[allow(clippy::too_many_arguments)]
    pub fn chain(
        &self,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
        root: u64,
        lora: Option<&str>,
        memo: Option<&mut DigestMemo>,
        out: &mut Vec<u64>,
    ) {
        match self {
            HashScheme::Xxh3(h) => chain_token_hashes(h, root, tokens, block_size, max_blocks, out),
            HashScheme::VllmSha256Cbor(h) => {
                h.chain_memo(tokens, block_size, max_blocks, lora, memo, out)
            }
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

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn vllm_none_hash_and_cbor_heads() {
        // sha256(cbor2.dumps("0", canonical=True)) = sha256(b"\x610")
        let h = VllmSha256Cbor::new("0");
        assert_eq!(h.none_hash.to_vec(), Sha256::digest(b"\x610").to_vec());
        let mut v = Vec::new();
        for n in [0u64, 23, 24, 255, 256, 65535, 65536, 1 << 32] {
            cbor_head(0, n, &mut v);
        }
        assert_eq!(
            v,
            hex("0017181818ff19010019ffff1a000100001b0000000100000000")
        );
    }

    #[test]
    fn vllm_block_key_layout() {
        // One block [1, 500] after NONE_HASH, LoRA "ad": the CBOR bytes spelled out.
        let h = VllmSha256Cbor::new("0");
        let mut key = vec![0x83, 0x58, 0x20];
        key.extend_from_slice(&h.none_hash);
        key.extend_from_slice(&[0x82, 0x01, 0x19, 0x01, 0xF4, 0x81, 0x62, b'a', b'd']);
        let want = block_hash_key(&Sha256::digest(&key));
        let mut out = Vec::new();
        h.chain(&[1, 500, 7], 2, 9, Some("ad"), &mut out);
        assert_eq!(out, vec![want]);
        out.clear();
        h.chain(&[1, 500], 2, 9, None, &mut out);
        assert_ne!(out, vec![want]); // extra_keys None (0xf6) differs
    }

    #[test]
    fn chain_shares_prefix_then_diverges() {
        for scheme in [
            HashScheme::by_name("xxh3", "").unwrap(),
            HashScheme::by_name("vllm-sha256-cbor", "0").unwrap(),
        ] {
            let a: Vec<u32> = (0..40).collect();
            let mut b = a.clone();
            b[20] = 999;
            let run = |t: &[u32], lora| {
                let mut v = Vec::new();
                scheme.chain(t, 8, usize::MAX, 5, lora, None, &mut v);
                v
            };
            let (ha, hb) = (run(&a, None), run(&b, None));
            assert_eq!(ha.len(), 5); // 40 / 8, no partial block
            assert_eq!(ha[..2], hb[..2]);
            assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
            let mut v = Vec::new();
            scheme.chain(&a, 8, 2, 5, None, None, &mut v);
            assert_eq!(v, ha[..2]);
        }
        assert!(HashScheme::by_name("cpython-tuple", "0").is_none());
    }

    /// Random prompts sharing prefixes of random lengths (and LoRA or not): the memoised
    /// chain equals the plain one, and shared full blocks are served from the memo.
    #[test]
    fn memo_chain_equals_plain_chain() {
        let h = VllmSha256Cbor::new("7");
        let mut rnd = crate::test_rng(0x2545_F491_4F6C_DD1D);
        for cap in [0usize, 6, 1 << 16] {
            let mut memo = DigestMemo::new(cap);
            let mut prompts: Vec<Vec<u32>> = vec![(0..200).map(|_| rnd(50_000) as u32).collect()];
            for _ in 0..200 {
                let base = &prompts[rnd(prompts.len() as u64) as usize];
                let keep = rnd(base.len() as u64 + 1) as usize;
                let mut p = base[..keep].to_vec();
                p.extend((0..rnd(80)).map(|_| rnd(50_000) as u32));
                let bs = [1usize, 4, 16][rnd(3) as usize];
                let lora = [None, Some("a"), Some("bb")][rnd(3) as usize];
                let (mut plain, mut memod) = (Vec::new(), Vec::new());
                h.chain(&p, bs, usize::MAX, lora, &mut plain);
                h.chain_memo(&p, bs, usize::MAX, lora, Some(&mut memo), &mut memod);
                assert_eq!(plain, memod);
                if cap == 1 << 16 {
                    // a second pass is served entirely from the memo
                    let mut again = Vec::new();
                    let hits = memo.hits();
                    h.chain_memo(&p, bs, usize::MAX, lora, Some(&mut memo), &mut again);
                    assert_eq!(again, plain);
                    assert_eq!(memo.hits() - hits, plain.len() as u64);
                }
                assert!(memo.len() <= cap);
                prompts.push(p);
            }
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
        let a: Vec<u32> = (0..16).collect();
        assert_ne!(
            chain(&Xxh3Tokens::default(), 6, &a, 8)[0],
            chain(&Xxh3Tokens::default(), 5, &a, 8)[0]
        ); // root separates adapters
    }

    #[test]
    fn limits_and_bytes_keys() {
        let mut v = Vec::new();
        let x = Xxh3Tokens::default();
        chain_token_hashes(&x, 0, &[1, 2, 3], 0, 9, &mut v);
        chain_token_hashes(&x, 0, &[1, 2, 3], 2, 0, &mut v);
        VllmSha256Cbor::new("0").chain(&[1, 2, 3], 0, 9, None, &mut v);
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
