//! One round-robin position per ModelServer, shared by Python's RoundRobinBalancer and the
//! Rust front's own decisions (front/table.rs), so the rotation stays exact whichever of
//! the two decides a request and across table installs (every config reload reinstalls).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;

#[pyclass(module = "kthena_router._core", frozen)]
#[derive(Default)]
pub struct Rotation {
    next: Arc<AtomicUsize>,
}

#[pymethods]
impl Rotation {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// The first of `n` endpoints for this request; advances only when there is a choice.
    fn start(&self, n: usize) -> usize {
        start(&self.next, n)
    }
}

impl Rotation {
    pub fn shared(&self) -> Arc<AtomicUsize> {
        self.next.clone()
    }
}

pub fn start(next: &AtomicUsize, n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        next.fetch_add(1, Ordering::Relaxed) % n
    }
}
