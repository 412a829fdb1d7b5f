//! Binding of the prefix-cache hashing and index: bytes and ints only.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::gil;
use kthena_core::{branch_points, prefix_hash, prefix_index, prefix_traffic};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Hash work (bytes actually hashed) above which the GIL is released.
const GIL_RELEASE_BYTES: usize = 32 * 1024;

/// The chain hashes of one prompt, kept in Rust: the request path hands them back to
/// `PrefixIndex.insert` without building a Python int per block.
#[pyclass(frozen, module = "kthena_router._core")]
pub struct BlockHashes {
    hashes: Vec<u64>,
}

impl BlockHashes {
    pub fn from_vec(hashes: Vec<u64>) -> Self {
        BlockHashes { hashes }
    }
}

#[pymethods]
impl BlockHashes {
    #[new]
    fn new(hashes: Vec<u64>) -> Self {
        BlockHashes { hashes }
    }

    fn __len__(&self) -> usize {
        self.hashes.len()
    }

    fn tolist(&self) -> Vec<u64> {
        self.hashes.clone()
    }

    /// The hashes as little-endian u64 words (8 bytes a block): what the pod-state link and
    /// the shared index send, without a Python int per block.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        PyBytes::new_with(py, 8 * self.hashes.len(), |out| {
            prefix_hash::write_le(&self.hashes, out);
            Ok(())
        })
    }

    /// The inverse of `to_bytes`: from `bytes` or any contiguous byte buffer (a memoryview
    /// slice of a received frame). ValueError unless the length is a multiple of 8.
    #[staticmethod]
    fn from_bytes(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let hashes = if let Ok(b) = data.downcast::<PyBytes>() {
            prefix_hash::read_le(b.as_bytes())
        } else {
            let buf = PyBuffer::<u8>::get(data)?;
            prefix_hash::read_le(&buf.to_vec(data.py())?)
        };
        hashes.map(|hashes| BlockHashes { hashes }).ok_or_else(|| {
            PyValueError::new_err("block hash bytes must be little-endian u64 words")
        })
    }

    fn __repr__(&self) -> String {
        format!("BlockHashes(<{} blocks>)", self.hashes.len())
    }
}

fn hash_prompt(
    py: Python<'_>,
    prompt: &[u8],
    block_size: usize,
    seed: u64,
    max_blocks: usize,
) -> PyResult<Vec<u64>> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be positive"));
    }
    let mut out = Vec::new();
    let work = (prompt.len() / block_size)
        .min(max_blocks)
        .saturating_mul(block_size);
    gil::run(py, work > GIL_RELEASE_BYTES, || {
        prefix_hash::chain_hashes(prompt, block_size, seed, max_blocks, &mut out)
    });
    Ok(out)
}

/// Seed of the hash chain for a (model, LoRA adapter) pair (`lora` empty for the base model).
#[pyfunction]
pub fn prefix_seed(model: &[u8], lora: &[u8]) -> u64 {
    prefix_hash::seed_for(model, lora)
}

/// Chain hashes of the full blocks of `prompt` (at most `max_blocks`).
#[pyfunction]
pub fn prefix_hashes(
    py: Python<'_>,
    prompt: &[u8],
    block_size: usize,
    seed: u64,
    max_blocks: usize,
) -> PyResult<BlockHashes> {
    Ok(BlockHashes {
        hashes: hash_prompt(py, prompt, block_size, seed, max_blocks)?,
    })
}

/// Consistent-hash key of `prompt`: the chain hash of its first `blocks` full blocks (all of
/// them when fewer; the whole prompt's hash without a full block).
#[pyfunction]
pub fn prefix_key(
    py: Python<'_>,
    prompt: &[u8],
    block_size: usize,
    seed: u64,
    blocks: usize,
) -> PyResult<u64> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be positive"));
    }
    let work = prompt.len().min(blocks.saturating_mul(block_size));
    Ok(gil::run(py, work > GIL_RELEASE_BYTES, || {
        prefix_hash::prefix_key(prompt, block_size, seed, blocks)
    }))
}

/// Which endpoint (u32 id) holds which block hash, with a per-endpoint LRU capacity.
/// Behind a mutex: the Rust front's table matches and inserts on the same index. A long
/// prompt is hashed with the GIL released and without the lock.
#[pyclass(module = "kthena_router._core")]
pub struct PrefixIndex {
    inner: Arc<Mutex<prefix_index::PrefixIndex>>,
    out: Vec<(u32, u32)>,
}

impl PrefixIndex {
    fn lock(&self) -> MutexGuard<'_, prefix_index::PrefixIndex> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index itself, for the front's table (rust/py/src/front/table.rs).
    pub fn shared(&self) -> Arc<Mutex<prefix_index::PrefixIndex>> {
        self.inner.clone()
    }
}

#[pymethods]
impl PrefixIndex {
    /// `hint_slots`: entries of the evicted-owner hint table (0 = no hints).
    /// `traffic_block_bytes` > 0: count every insert as a dispatch of its prompt's prefix
    /// key (the blocks of this many bytes covering the prompt's first KEY_BYTES), for
    /// `miss_scores`.
    #[new]
    #[pyo3(signature = (default_capacity, *, hint_slots = 0, traffic_block_bytes = 0))]
    fn new(default_capacity: u32, hint_slots: u32, traffic_block_bytes: usize) -> Self {
        let mut index = prefix_index::PrefixIndex::with_hints(default_capacity, hint_slots);
        if traffic_block_bytes > 0 {
            index.track_traffic(prefix_traffic::KEY_BYTES.div_ceil(traffic_block_bytes));
        }
        PrefixIndex { inner: Arc::new(Mutex::new(index)), out: Vec::new() }
    }

    /// balanceMisses' prefix scores for a prompt of `total` blocks that no endpoint holds:
    /// [(endpoint, blocks)], each of `ids` by the expected load its prefixes bring:
    /// `total` x (max - load) / max, the most loaded left out; [] without traffic on `ids`
    /// or without traffic counting.
    fn miss_scores(&mut self, ids: Vec<u32>, total: u32) -> Vec<(u32, u32)> {
        self.lock().miss_scores(&ids, total)
    }

    /// Slots of the evicted-owner hint table (0 without hints).
    #[getter]
    fn hint_slots(&self) -> usize {
        self.lock().hint_slots()
    }

    /// The request path in one call: hash the prompt, then match the chain.
    /// Returns (hashes, [(endpoint, matched_blocks)]) for endpoints matching >= 1 block.
    fn match_prompt(
        &mut self,
        py: Python<'_>,
        prompt: &[u8],
        block_size: usize,
        seed: u64,
        max_blocks: usize,
    ) -> PyResult<(BlockHashes, Vec<(u32, u32)>)> {
        let hashes = hash_prompt(py, prompt, block_size, seed, max_blocks)?;
        let PrefixIndex { inner, out } = self;
        inner.lock().unwrap_or_else(|e| e.into_inner()).match_hashes(&hashes, out);
        Ok((BlockHashes { hashes }, out.clone()))
    }

    /// Match precomputed hashes: [(endpoint, matched_blocks)] for endpoints matching >= 1.
    fn match_hashes(&mut self, hashes: &BlockHashes) -> Vec<(u32, u32)> {
        let PrefixIndex { inner, out } = self;
        inner.lock().unwrap_or_else(|e| e.into_inner()).match_hashes(&hashes.hashes, out);
        out.clone()
    }

    /// Record that `endpoint` now holds the chain (call at dispatch).
    fn insert(&mut self, endpoint: u32, hashes: &BlockHashes) {
        self.lock().insert(endpoint, &hashes.hashes);
    }

    /// Forget these hashes for `endpoint`; returns how many it held.
    fn evict(&mut self, endpoint: u32, hashes: &BlockHashes) -> usize {
        self.lock().evict(endpoint, &hashes.hashes)
    }

    /// Purge an endpoint; returns the entries removed.
    fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        self.lock().remove_endpoint(endpoint)
    }

    /// Set an endpoint's capacity in entries, evicting its least recently used above it.
    fn set_capacity(&mut self, endpoint: u32, capacity: u32) {
        self.lock().set_capacity(endpoint, capacity);
    }

    fn endpoint_len(&self, endpoint: u32) -> usize {
        self.lock().endpoint_len(endpoint)
    }

    fn endpoints(&self) -> Vec<u32> {
        let mut v = self.lock().endpoints();
        v.sort_unstable();
        v
    }

    /// Bytes allocated by the index's own structures.
    fn memory_bytes(&self) -> usize {
        self.lock().memory_bytes()
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }
}

/// Shared prefixes of the prompts seen (kthena_core::branch_points): the block counts of a
/// chain's prefixes that other prompts continued differently.
#[pyclass(module = "kthena_router._core")]
pub struct BranchPoints {
    inner: branch_points::BranchPoints,
}

#[pymethods]
impl BranchPoints {
    #[new]
    fn new(generation: usize) -> Self {
        BranchPoints { inner: branch_points::BranchPoints::new(generation) }
    }

    /// Record the chain; return, ascending, the block counts of its prefixes that branch.
    fn observe(&mut self, hashes: &BlockHashes) -> Vec<u32> {
        self.inner.observe(&hashes.hashes)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
