//! Chained block hashes of a prompt, for the approximate prefix-cache index.
//!
//! The prompt bytes are cut into blocks of `block_size` bytes; a trailing partial block is
//! not hashed (an engine cannot have cached it either). Block `i` hashes as
//!
//! ```text
//! h_i = xxh3_64_with_seed(le_bytes(h_{i-1}) || block_i, seed),   h_{-1} = seed
//! ```
//!
//! so `h_i` identifies the whole prefix `block_0..=block_i`: equal hashes at position `i`
//! mean equal prefixes (up to 64-bit collisions), which lets the index store one hash per
//! block instead of prefixes. The seed comes from the (model, LoRA adapter) pair
//! ([`seed_for`]), so one index can serve every model without cross-model matches.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Seed of the hash chain for a (model, LoRA adapter) pair; `lora` is empty for the base
/// model. 0xFF separates the parts: it never occurs in UTF-8, so ("ab", "c") != ("a", "bc").
pub fn seed_for(model: &[u8], lora: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(model.len() + 1 + lora.len());
    buf.extend_from_slice(model);
    buf.push(0xFF);
    buf.extend_from_slice(lora);
    xxh3_64(&buf)
}

/// Append the chain hashes of at most `max_blocks` full blocks of `prompt` to `out`.
/// `block_size == 0` hashes nothing.
pub fn chain_hashes(
    prompt: &[u8],
    block_size: usize,
    seed: u64,
    max_blocks: usize,
    out: &mut Vec<u64>,
) {
    if block_size == 0 {
        return;
    }
    let n = (prompt.len() / block_size).min(max_blocks);
    out.reserve(n);
    // One reused buffer: the previous hash followed by the block.
    let mut buf = vec![0u8; 8 + block_size];
    let mut prev = seed;
    for block in prompt.chunks_exact(block_size).take(n) {
        buf[..8].copy_from_slice(&prev.to_le_bytes());
        buf[8..].copy_from_slice(block);
        prev = xxh3_64_with_seed(&buf, seed);
        out.push(prev);
    }
}

/// Consistent-hash key of a prompt: the chain hash of its first `blocks` full blocks (of
/// all of them when it has fewer), i.e. the identity of that prefix; a prompt without a
/// full block hashes whole. Equal leading `blocks * block_size` bytes give equal keys.
pub fn prefix_key(prompt: &[u8], block_size: usize, seed: u64, blocks: usize) -> u64 {
    if block_size == 0 || blocks == 0 || prompt.len() < block_size {
        return xxh3_64_with_seed(prompt, seed);
    }
    let mut hashes = Vec::new();
    chain_hashes(prompt, block_size, seed, blocks, &mut hashes);
    hashes[hashes.len() - 1]
}

/// Append `hashes` as little-endian u64 words to `out`: the wire form of a chain (pod-state
/// INSERTS records, shared-index stream records).
pub fn write_le(hashes: &[u64], out: &mut [u8]) {
    for (w, h) in out.chunks_exact_mut(8).zip(hashes) {
        w.copy_from_slice(&h.to_le_bytes());
    }
}

/// The chain in `bytes` (little-endian u64 words); None unless the length is a multiple of 8.
pub fn read_le(bytes: &[u8]) -> Option<Vec<u64>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(p: &[u8], bs: usize, seed: u64, max: usize) -> Vec<u64> {
        let mut v = Vec::new();
        chain_hashes(p, bs, seed, max, &mut v);
        v
    }

    #[test]
    fn matches_definition() {
        let p = b"abcdefghij";
        let s: u64 = 7;
        let h0 = xxh3_64_with_seed(&[&s.to_le_bytes()[..], b"abcd"].concat(), s);
        let h1 = xxh3_64_with_seed(&[&h0.to_le_bytes()[..], b"efgh"].concat(), s);
        assert_eq!(hashes(p, 4, s, 100), vec![h0, h1]); // "ij" is a partial block
    }

    #[test]
    fn prefix_key_is_the_last_hash_of_the_leading_blocks() {
        let p = b"0123456789abcdefXYZ";
        assert_eq!(prefix_key(p, 4, 3, 2), hashes(p, 4, 3, 100)[1]);
        assert_eq!(prefix_key(p, 4, 3, 99), hashes(p, 4, 3, 100)[3]);
        // Same leading blocks, different rest: same key.
        assert_eq!(
            prefix_key(b"01234567zz", 4, 3, 2),
            prefix_key(b"01234567yyyy", 4, 3, 2)
        );
        assert_ne!(prefix_key(b"0123", 4, 3, 2), prefix_key(b"0124", 4, 3, 2));
        assert_ne!(prefix_key(b"ab", 4, 3, 2), prefix_key(b"ac", 4, 3, 2)); // no full block
    }

    #[test]
    fn le_bytes_round_trip() {
        let h = vec![0, 1, u64::MAX, 0x0102_0304_0506_0708];
        let mut b = vec![0u8; 8 * h.len()];
        write_le(&h, &mut b);
        assert_eq!(&b[24..], &[8, 7, 6, 5, 4, 3, 2, 1]); // little-endian on every host
        assert_eq!(read_le(&b), Some(h));
        assert_eq!(read_le(&[]), Some(vec![]));
        assert_eq!(read_le(&b[..7]), None);
    }

    #[test]
    fn limits() {
        assert!(hashes(b"abc", 4, 1, 10).is_empty());
        assert!(hashes(b"abcdefgh", 0, 1, 10).is_empty());
        assert_eq!(hashes(b"abcdefgh", 2, 1, 3).len(), 3);
        assert_eq!(hashes(b"abcdefgh", 2, 1, 0).len(), 0);
    }

    #[test]
    fn shared_prefix_shares_hashes_then_diverges_forever() {
        let a = b"0123456789abcdefXXXX0123";
        let b = b"0123456789abcdefYYYY0123";
        let (ha, hb) = (hashes(a, 4, 9, 100), hashes(b, 4, 9, 100));
        assert_eq!(ha[..4], hb[..4]);
        // Block 5 ("0123") is equal in both, but its prefix differs.
        assert!(ha[4..].iter().zip(&hb[4..]).all(|(x, y)| x != y));
    }

    #[test]
    fn seed_separates_models_and_adapters() {
        assert_ne!(seed_for(b"m", b""), seed_for(b"m", b"lora"));
        assert_ne!(seed_for(b"ab", b"c"), seed_for(b"a", b"bc"));
        let p = b"abcdabcd";
        assert_ne!(
            hashes(p, 4, seed_for(b"m", b""), 9),
            hashes(p, 4, seed_for(b"n", b""), 9)
        );
    }
}
