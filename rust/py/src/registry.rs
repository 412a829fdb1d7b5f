//! The plugin registry as plain data: what the Python configuration loader derives its
//! plugin names and argument validation from.

use kthena_core::policies::{self, ArgSpec, Reader, Value};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

fn default<'py>(py: Python<'py>, v: Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Absent => py.None().into_bound(py),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Str(s) => s.into_pyobject(py)?.into_any(),
        Value::EmptyMap => PyDict::new(py).into_any(),
    })
}

fn arg<'py>(py: Python<'py>, a: &ArgSpec) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", a.name)?;
    d.set_item("field", a.field)?;
    d.set_item("kind", a.kind.as_str())?;
    d.set_item("default", default(py, a.default)?)?;
    d.set_item("min", a.min)?;
    d.set_item("max", a.max)?;
    d.set_item("kthena", a.kthena)?;
    let reader = match a.reader {
        Reader::Policy => "policy",
        Reader::Router => "router",
    };
    d.set_item("reader", reader)?;
    d.set_item("paths", a.paths)?;
    Ok(d)
}

/// Every implemented plugin, in registry order, as dicts (see `_core.pyi`).
#[pyfunction]
pub fn plugin_registry(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for p in policies::REGISTRY {
        let d = PyDict::new(py);
        d.set_item("name", p.name)?;
        d.set_item("score", p.score)?;
        d.set_item("filter", p.filter)?;
        d.set_item("affinity", p.affinity)?;
        d.set_item("prefix_input", p.prefix_input)?;
        d.set_item("prefix_key", p.prefix_key)?;
        let args = PyList::empty(py);
        for a in p.args {
            args.append(arg(py, a)?)?;
        }
        d.set_item("args", args)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Kthena plugins recognised but not implemented: name -> reason.
#[pyfunction]
pub fn refused_plugins() -> Vec<(&'static str, &'static str)> {
    policies::REFUSED.to_vec()
}
