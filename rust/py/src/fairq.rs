//! Binding of the fair queue: integers and floats only (tenants interned by the caller).

use kthena_core::fairq::{self, ClassSpec, CostModel};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Per-model fair queue (priority levels, then VTC per tenant). One per model per worker;
/// not for concurrent use from several threads.
#[pyclass(module = "kthena_router._core")]
pub struct FairQueue {
    inner: fairq::FairQueue,
}

#[pymethods]
impl FairQueue {
    /// `classes`: [(order, weight, max_len)]; class ids are the list's indices.
    #[new]
    #[pyo3(signature = (classes, input_weight=1.0, output_weight=2.0, token_weight=1.0, request_weight=0.0))]
    fn new(
        classes: Vec<(u32, f64, u32)>,
        input_weight: f64,
        output_weight: f64,
        token_weight: f64,
        request_weight: f64,
    ) -> PyResult<Self> {
        let specs = classes
            .into_iter()
            .map(|(order, weight, max_len)| ClassSpec {
                order,
                weight,
                max_len,
            })
            .collect();
        let cost = CostModel {
            input: input_weight,
            output: output_weight,
            token: token_weight,
            request: request_weight,
        };
        let inner = fairq::FairQueue::new(specs, cost).map_err(PyValueError::new_err)?;
        Ok(FairQueue { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn class_len(&self, class_id: u32) -> u32 {
        self.inner.class_len(class_id)
    }

    fn set_max_len(&mut self, class_id: u32, max_len: u32) {
        self.inner.set_max_len(class_id, max_len);
    }

    /// Ticket (> 0), or 0 when the class is full.
    fn enqueue(
        &mut self,
        class_id: u32,
        tenant: u32,
        weight: f64,
        input_est: u32,
        now_ms: u64,
    ) -> PyResult<u64> {
        let t = self
            .inner
            .enqueue(class_id, tenant, weight, input_est, now_ms)
            .map_err(PyValueError::new_err)?;
        Ok(t.unwrap_or(0))
    }

    /// Next ticket to dispatch, charged its dispatch cost; 0 when nothing waits.
    fn dequeue(&mut self, now_ms: u64) -> u64 {
        self.inner.dequeue(now_ms).map_or(0, |(t, _, _)| t)
    }

    fn admit(
        &mut self,
        class_id: u32,
        tenant: u32,
        weight: f64,
        input_est: u32,
        now_ms: u64,
    ) -> PyResult<()> {
        self.inner
            .admit(class_id, tenant, weight, input_est, now_ms)
            .map_err(PyValueError::new_err)
    }

    fn cancel(&mut self, ticket: u64) -> bool {
        self.inner.cancel(ticket)
    }

    fn settle(
        &mut self,
        class_id: u32,
        tenant: u32,
        input_delta: i64,
        output: u64,
        now_ms: u64,
    ) -> PyResult<()> {
        self.inner
            .settle(class_id, tenant, input_delta, output, now_ms)
            .map_err(PyValueError::new_err)
    }

    fn counter(&self, class_id: u32, tenant: u32) -> Option<f64> {
        self.inner.counter(class_id, tenant)
    }

    fn prune(&mut self, now_ms: u64, idle_ms: u64) -> Vec<u32> {
        self.inner.prune(now_ms, idle_ms)
    }

    fn tenants(&self) -> usize {
        self.inner.tenants()
    }

    fn waiting(&self) -> Vec<(u64, u32, u32)> {
        self.inner.waiting()
    }
}
