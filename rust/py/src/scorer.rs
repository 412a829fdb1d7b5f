//! Binding of the scheduling scorer: configuration from plain values, signals as numbers,
//! one `schedule` call per request returning endpoint ids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kthena_core::policies::Args;
use kthena_core::scorer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

/// `pluginConfig[].args` value as a number; None (with the caller warning) otherwise.
fn arg_number(v: &Bound<'_, PyAny>) -> Option<f64> {
    if v.is_instance_of::<PyBool>() {
        return v.extract::<bool>().ok().map(|b| if b { 1.0 } else { 0.0 });
    }
    if v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>() {
        return v.extract::<f64>().ok();
    }
    if v.is_instance_of::<PyString>() {
        return v.extract::<String>().ok()?.trim().parse::<f64>().ok();
    }
    None
}

/// Filter and score plugins by Kthena name over endpoint signals held in Rust.
/// Behind a mutex: the Rust front's table scores on the very state Python feeds.
#[pyclass(module = "kthena_router._core")]
pub struct Scorer {
    inner: Arc<Mutex<scorer::Scorer>>,
    out: Vec<u32>,
    warnings: Vec<String>,
}

impl Scorer {
    fn lock(&self) -> MutexGuard<'_, scorer::Scorer> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scorer itself, for the front's table (rust/py/src/front/table.rs).
    pub fn shared(&self) -> Arc<Mutex<scorer::Scorer>> {
        self.inner.clone()
    }
}

#[pymethods]
impl Scorer {
    #[new]
    #[pyo3(signature = (filters, scores, args=None, *, hot_spot_abs=64.0, hot_spot_rel=1.5, max_candidates=0))]
    fn new(
        filters: Vec<String>,
        scores: Vec<(String, f64)>,
        args: Option<HashMap<String, HashMap<String, Bound<'_, PyAny>>>>,
        hot_spot_abs: f64,
        hot_spot_rel: f64,
        max_candidates: usize,
    ) -> PyResult<Self> {
        let mut warnings = Vec::new();
        let mut plugin_args = Vec::new();
        for (name, kv) in args.unwrap_or_default() {
            let mut vals = Vec::new();
            for (k, v) in kv {
                match arg_number(&v) {
                    Some(x) => vals.push((k, x)),
                    None => warnings.push(format!(
                        "scheduler plugin {name:?}: argument {k:?} is not a number, ignored"
                    )),
                }
            }
            plugin_args.push((name, Args(vals)));
        }
        let cfg = scorer::ScorerConfig {
            filters,
            scores,
            args: plugin_args,
            hot_spot_abs,
            hot_spot_rel,
            max_candidates,
        };
        let inner = scorer::Scorer::new(&cfg).map_err(PyValueError::new_err)?;
        warnings.extend(inner.warnings().iter().cloned());
        Ok(Scorer {
            inner: Arc::new(Mutex::new(inner)),
            out: Vec::new(),
            warnings,
        })
    }

    /// Non-fatal configuration remarks (ignored arguments).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Times the hot-spot guard made load win.
    #[getter]
    fn hot_spot_count(&self) -> u64 {
        self.lock().hot_spot_count()
    }

    /// `identity`: the endpoint's address bytes (e.g. b"10.0.0.5:8000"), the same in every
    /// router process: consistent hashing ranks its hash, not the process's id.
    #[pyo3(signature = (endpoint, identity=None))]
    fn add_endpoint(&mut self, endpoint: u32, identity: Option<&[u8]>) {
        self.lock().add_endpoint(endpoint);
        if let Some(b) = identity {
            // xxh3-64 of the bytes, as the request-id hash.
            self.lock().set_identity(endpoint, scorer::request_hash(b));
        }
    }

    fn remove_endpoint(&mut self, endpoint: u32) -> bool {
        self.lock().remove_endpoint(endpoint)
    }

    fn endpoints(&self) -> Vec<u32> {
        self.lock().endpoints()
    }

    #[pyo3(signature = (endpoint, running, waiting, kv_usage, ttft_s=f64::NAN, tpot_s=f64::NAN))]
    fn update_metrics(
        &mut self,
        endpoint: u32,
        running: f64,
        waiting: f64,
        kv_usage: f64,
        ttft_s: f64,
        tpot_s: f64,
    ) {
        self.lock()
            .update_metrics(endpoint, running, waiting, kv_usage, ttft_s, tpot_s);
    }

    fn mark_stale(&mut self, endpoint: u32) {
        self.lock().mark_stale(endpoint);
    }

    fn add_in_flight(&mut self, endpoint: u32, delta: i64) -> u32 {
        self.lock().add_in_flight(endpoint, delta)
    }

    /// A request for adapter `lora_id` dispatched to (+1) or finished on (-1) `endpoint`.
    fn add_lora_in_flight(&mut self, endpoint: u32, lora_id: u32, delta: i64) {
        self.lock().add_lora_in_flight(endpoint, lora_id, delta);
    }

    /// The pod's other workers' requests for adapter `lora_id` dispatched to (+) or finished
    /// on (-) `endpoint` (relayed by the pod-state hub).
    fn add_remote_lora_in_flight(&mut self, endpoint: u32, lora_id: u32, delta: i64) {
        self.lock().add_remote_lora_in_flight(endpoint, lora_id, delta);
    }

    /// Drop the relayed adapters of `endpoint` that its engine no longer lists.
    fn retain_remote_loras(&mut self, endpoint: u32, lora_ids: Vec<u32>) {
        self.lock().retain_remote_loras(endpoint, &lora_ids);
    }

    /// Forget every relayed adapter count.
    fn clear_remote_loras(&mut self) {
        self.lock().clear_remote_loras();
    }

    /// The pod's other workers dispatched (+) or finished (-) `delta` attempts on
    /// `endpoint` since the last scrape (relayed by the pod-state hub).
    fn add_remote_in_flight(&mut self, endpoint: u32, delta: i64) {
        self.lock().add_remote_in_flight(endpoint, delta)
    }

    #[pyo3(signature = (endpoint, ttft_s=f64::NAN, tpot_s=f64::NAN))]
    fn observe_latency(&mut self, endpoint: u32, ttft_s: f64, tpot_s: f64) {
        self.lock().observe_latency(endpoint, ttft_s, tpot_s);
    }

    /// Prefill work dispatched to the endpoint (+ uncached blocks) or done there (-).
    fn add_pending(&mut self, endpoint: u32, blocks: f64) {
        self.lock().add_pending(endpoint, blocks);
    }

    /// The share of its credited prefix hits the engine reports serving (prefill-cost's
    /// `realizedPrefix`); NaN = not measured (1).
    fn set_realization(&mut self, endpoint: u32, realization: f64) {
        self.lock().set_realization(endpoint, realization);
    }

    fn set_loras(&mut self, endpoint: u32, lora_ids: Vec<u32>, max_loras: u32) {
        self.lock().set_loras(endpoint, &lora_ids, max_loras);
    }

    /// The signals of one endpoint as a dict (admin views, tests); None if unknown.
    fn signals<'py>(&self, py: Python<'py>, endpoint: u32) -> PyResult<Option<Bound<'py, PyDict>>> {
        let g = self.lock();
        let Some(s) = g.signals(endpoint) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("remote_in_flight", s.remote_in_flight)?;
        d.set_item("remote_at_scrape", s.remote_at_scrape)?;
        d.set_item("running", s.running)?;
        d.set_item("waiting", s.waiting)?;
        d.set_item("kv_usage", s.kv_usage)?;
        d.set_item("ttft_s", s.ttft_s)?;
        d.set_item("tpot_s", s.tpot_s)?;
        d.set_item("pending_blocks", s.pending_blocks)?;
        d.set_item("hit_realization", s.hit_realization)?;
        d.set_item("stale", s.stale)?;
        d.set_item("loras", s.loras.clone())?;
        d.set_item("max_loras", s.max_loras)?;
        d.set_item("lora_in_flight", s.lora_in_flight.clone())?;
        d.set_item("lora_remote", s.lora_remote.clone())?;
        d.set_item("load", s.load())?;
        Ok(Some(d))
    }

    /// The `request_id_hash` for `schedule`: xxh3-64 of the request id's bytes.
    #[staticmethod]
    fn request_hash(request_id: &[u8]) -> u64 {
        scorer::request_hash(request_id)
    }

    /// One decision: ordered endpoint ids. `prefix_matches`: [(endpoint, matched_blocks)]
    /// (e.g. `PrefixIndex.match_prompt(...)[1]`) out of `total_blocks`; `prefix_key`: the
    /// request's `prefix_key(...)` for consistent-hash plugins (None: the request hash).
    #[pyo3(signature = (request_id_hash, prefix_matches, lora_id, total_blocks, prefix_key=None))]
    fn schedule(
        &mut self,
        request_id_hash: u64,
        prefix_matches: Option<Vec<(u32, u32)>>,
        lora_id: Option<u32>,
        total_blocks: u32,
        prefix_key: Option<u64>,
    ) -> Vec<u32> {
        let m = prefix_matches.unwrap_or_default();
        let Scorer { inner, out, .. } = self;
        inner.lock().unwrap_or_else(|e| e.into_inner()).schedule_keyed(
            request_id_hash,
            prefix_key,
            &m,
            lora_id,
            total_blocks,
            out,
        );
        self.out.clone()
    }
}
