//! Binding of the KV-event ownership table and the token block hashing.

use crate::gil;
use kthena_core::digest_memo::DigestMemo;
use kthena_core::kv_ownership;
use kthena_core::token_hash::{self, HashScheme};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex, MutexGuard};

/// Batches (bytes) and token arrays above these sizes are processed without the GIL.
const GIL_RELEASE_BATCH_BYTES: usize = 64 * 1024;
const GIL_RELEASE_TOKENS: usize = 8 * 1024;

fn scheme(name: &str, hash_seed: &str) -> PyResult<HashScheme> {
    HashScheme::by_name(name, hash_seed).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown hash scheme {name:?} (vllm-sha256-cbor, xxh3)"
        ))
    })
}

/// Token ids from a buffer of native u32 (`array('I')`, memoryview), `bytes` (little-endian
/// u32 array) or a sequence of ints.
fn tokens_of(tokens: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(b) = tokens.downcast::<PyBytes>() {
        let b = b.as_bytes();
        if !b.len().is_multiple_of(4) {
            return Err(PyValueError::new_err(
                "token bytes must be a little-endian u32 array",
            ));
        }
        return Ok(b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect());
    }
    if let Ok(buf) = PyBuffer::<u32>::get(tokens) {
        return buf.to_vec(tokens.py());
    }
    tokens.extract()
}

#[allow(clippy::too_many_arguments)]
fn hash_tokens(
    py: Python<'_>,
    s: HashScheme,
    tokens: &[u32],
    block_size: usize,
    root: u64,
    max_blocks: usize,
    lora: Option<&str>,
) -> PyResult<Vec<u64>> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be positive"));
    }
    let mut out = Vec::new();
    if tokens.len().min(max_blocks.saturating_mul(block_size)) > GIL_RELEASE_TOKENS {
        py.allow_threads(|| s.chain(tokens, block_size, max_blocks, root, lora, None, &mut out));
    } else {
        s.chain(tokens, block_size, max_blocks, root, lora, None, &mut out);
    }
    Ok(out)
}

fn lock(memo: &Mutex<DigestMemo>) -> MutexGuard<'_, DigestMemo> {
    // A panic while holding it leaves a consistent memo (entries are inserted whole).
    memo.lock().unwrap_or_else(|e| e.into_inner())
}

/// Chain hashes of the first min(len // block_size, max_blocks) full token blocks with
/// the named scheme (see _core.pyi).
#[pyfunction]
#[pyo3(signature = (tokens, block_size, root, max_blocks, scheme="xxh3", *, lora=None, hash_seed="0"))]
#[allow(clippy::too_many_arguments)]
pub fn token_block_hashes(
    py: Python<'_>,
    tokens: &Bound<'_, PyAny>,
    block_size: usize,
    root: u64,
    max_blocks: usize,
    scheme: &str,
    lora: Option<&str>,
    hash_seed: &str,
) -> PyResult<Vec<u64>> {
    let s = self::scheme(scheme, hash_seed)?;
    let t = tokens_of(tokens)?;
    hash_tokens(py, s, &t, block_size, root, max_blocks, lora)
}

/// Table key of an engine block hash sent as bytes: the last 8 bytes, big-endian (equal to
/// vLLM's int form of the same hash).
#[pyfunction]
pub fn block_hash_key(block_hash: &[u8]) -> u64 {
    token_hash::block_hash_key(block_hash)
}

/// Which endpoint holds which engine block hash, from KV events. See _core.pyi.
#[pyclass(module = "kthena_router._core")]
pub struct KvOwnership {
    inner: kv_ownership::KvOwnership,
    scheme: HashScheme,
    out: Vec<(u32, u32)>,
    /// Digests of recently hashed blocks (match_tokens); its own lock, so that long prompts
    /// are hashed without the GIL and without holding the table.
    memo: Arc<Mutex<DigestMemo>>,
}

#[pymethods]
impl KvOwnership {
    #[new]
    #[pyo3(signature = (default_capacity, hash_scheme="xxh3", hash_seed="0", *, hash_memo_blocks=0))]
    fn new(
        default_capacity: u32,
        hash_scheme: &str,
        hash_seed: &str,
        hash_memo_blocks: usize,
    ) -> PyResult<Self> {
        Ok(KvOwnership {
            inner: kv_ownership::KvOwnership::new(default_capacity),
            scheme: scheme(hash_scheme, hash_seed)?,
            out: Vec::new(),
            memo: Arc::new(Mutex::new(DigestMemo::new(hash_memo_blocks))),
        })
    }

    /// (entries, capacity, hits, misses) of the block digest memo.
    fn hash_memo_stats(&self) -> (usize, usize, u64, u64) {
        let m = lock(&self.memo);
        (m.len(), m.capacity(), m.hits(), m.misses())
    }

    fn clear_hash_memo(&self) {
        lock(&self.memo).clear();
    }

    /// Apply a batch in the flat encoding (little-endian u64 words: tag, n, n hashes;
    /// tags 1 BlockStored, 2 BlockRemoved, 3 AllBlocksCleared with n = 0). All or nothing.
    fn apply(&mut self, py: Python<'_>, endpoint: u32, batch: &[u8]) -> PyResult<usize> {
        if !batch.len().is_multiple_of(8) {
            return Err(PyValueError::new_err(
                "batch length must be a multiple of 8",
            ));
        }
        let inner = &mut self.inner;
        let run = move || {
            let words: Vec<u64> = batch
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            inner.apply_flat(endpoint, &words)
        };
        gil::run(py, batch.len() > GIL_RELEASE_BATCH_BYTES, run).map_err(PyValueError::new_err)
    }

    /// BlockStored: hashes in chain order (ints; mask negative ones with & (2**64 - 1)).
    fn stored(&mut self, endpoint: u32, block_hashes: Vec<u64>) {
        self.inner.stored(endpoint, &block_hashes);
    }

    /// BlockRemoved: one copy of each hash is gone.
    fn removed(&mut self, endpoint: u32, block_hashes: Vec<u64>) {
        self.inner.removed(endpoint, &block_hashes);
    }

    /// AllBlocksCleared; returns the entries removed.
    fn all_cleared(&mut self, endpoint: u32) -> usize {
        self.inner.all_cleared(endpoint)
    }

    /// [(endpoint, matched leading blocks)] over endpoints whose stream is up (>= 1 block).
    fn match_hashes(&mut self, block_hashes: Vec<u64>) -> Vec<(u32, u32)> {
        self.inner.match_hashes(&block_hashes, &mut self.out);
        self.out.clone()
    }

    /// Hash the request's tokens with the table's scheme (blocks hashed before come from
    /// the digest memo), then match: (number of full blocks hashed, [(endpoint,
    /// matched_blocks)]). Long prompts are hashed without the GIL and without holding the
    /// table (other threads may use it).
    #[pyo3(signature = (tokens, block_size, root=0, max_blocks=usize::MAX, lora=None))]
    fn match_tokens(
        slf: &Bound<'_, Self>,
        tokens: &Bound<'_, PyAny>,
        block_size: usize,
        root: u64,
        max_blocks: usize,
        lora: Option<&str>,
    ) -> PyResult<(usize, Vec<(u32, u32)>)> {
        let py = slf.py();
        let t = tokens_of(tokens)?;
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be positive"));
        }
        let (scheme, memo) = {
            let me = slf.borrow();
            (me.scheme, Arc::clone(&me.memo))
        };
        let mut hashes = Vec::new();
        let run = || {
            let mut m = lock(&memo);
            scheme.chain(
                &t,
                block_size,
                max_blocks,
                root,
                lora,
                Some(&mut m),
                &mut hashes,
            )
        };
        gil::run(
            py,
            t.len().min(max_blocks.saturating_mul(block_size)) > GIL_RELEASE_TOKENS,
            run,
        );
        let mut me = slf.borrow_mut();
        let me = &mut *me;
        me.inner.match_hashes(&hashes, &mut me.out);
        Ok((hashes.len(), me.out.clone()))
    }

    fn remove_endpoint(&mut self, endpoint: u32) -> usize {
        self.inner.remove_endpoint(endpoint)
    }

    #[pyo3(signature = (endpoint, down, clear=true))]
    fn set_stream_down(&mut self, endpoint: u32, down: bool, clear: bool) {
        self.inner.set_stream_down(endpoint, down, clear);
    }

    fn is_stream_down(&self, endpoint: u32) -> bool {
        self.inner.is_stream_down(endpoint)
    }

    fn down_endpoints(&self) -> Vec<u32> {
        let mut v = self.inner.down_endpoints();
        v.sort_unstable();
        v
    }

    fn set_capacity(&mut self, endpoint: u32, capacity: u32) {
        self.inner.set_capacity(endpoint, capacity);
    }

    fn endpoint_len(&self, endpoint: u32) -> usize {
        self.inner.endpoint_len(endpoint)
    }

    fn endpoints(&self) -> Vec<u32> {
        let mut v = self.inner.endpoints();
        v.sort_unstable();
        v
    }

    /// Hashes the endpoint holds, newest stored first.
    fn endpoint_hashes(&self, endpoint: u32) -> Vec<u64> {
        self.inner.endpoint_hashes(endpoint)
    }

    fn refs(&self, endpoint: u32, block_hash: u64) -> u32 {
        self.inner.refs(endpoint, block_hash)
    }

    #[getter]
    fn overflow_drops(&self) -> u64 {
        self.inner.overflow_drops()
    }

    #[getter]
    fn unknown_removals(&self) -> u64 {
        self.inner.unknown_removals()
    }

    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
