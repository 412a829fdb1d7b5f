//! Running heavy work without the GIL, light work with it.

use pyo3::Python;

/// Runs `f` with the GIL released when `heavy`: releasing and re-taking it costs more
/// than short work, and long work must not stall the event loop's other threads.
pub fn run<T: Send>(py: Python<'_>, heavy: bool, f: impl Send + FnOnce() -> T) -> T {
    if heavy {
        py.allow_threads(f)
    } else {
        f()
    }
}
