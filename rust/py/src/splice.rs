//! Binding of `kthena_core::json_splice`: bytes in, bytes out.

use crate::gil;
use kthena_core::json_splice;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Below this size the GIL round trip costs more than the scan itself.
const GIL_RELEASE_BYTES: usize = 64 * 1024;

/// Replace (or append) top-level members of a JSON object without re-encoding it.
/// See `kthena_core::json_splice` for the exact semantics.
#[pyfunction]
pub fn splice_top_level<'py>(
    py: Python<'py>,
    body: &[u8],
    replacements: Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let reps: Vec<(&[u8], &[u8])> = replacements
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    let big = body.len() > GIL_RELEASE_BYTES;
    let to_py = |e: json_splice::SpliceError| PyValueError::new_err(e.to_string());
    let plan = gil::run(py, big, || json_splice::plan(body, &reps)).map_err(to_py)?;
    // Written straight into the new bytes object: one copy of the body, not two.
    PyBytes::new_with(py, plan.output_len(), |out| {
        gil::run(py, big, || plan.write_into(body, &reps, out)).map_err(to_py)
    })
}
