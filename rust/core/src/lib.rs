//! Pure-Rust core of the router: the hot data structures, testable with `cargo test`
//! and free of Python. The `kthena-py` crate exposes them to Python.
#![forbid(unsafe_code)]

pub mod branch_points;
pub mod digest_memo;
pub mod evicted_hints;
pub mod fairq;
pub mod json_splice;
pub mod kv_ownership;
mod owner_table;
pub mod policies;
pub mod prefix_hash;
pub mod prefix_index;
pub mod prefix_traffic;
pub mod scorer;
pub mod token_hash;

/// Tests' random numbers: an xorshift64 generator of values below `m` (deterministic,
/// no dependency).
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |m| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    }
}
