//! PyO3 binding of kthena-core. Only bytes and integers cross the boundary on the hot path.
#![forbid(unsafe_code)]

use pyo3::prelude::*;

mod fairq;
mod front;
mod gil;
mod kv_ownership;
mod prefix;
mod registry;
mod rotation;
mod scorer;
mod splice;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(splice::splice_top_level, m)?)?;
    m.add_function(wrap_pyfunction!(prefix::prefix_seed, m)?)?;
    m.add_function(wrap_pyfunction!(prefix::prefix_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(prefix::prefix_key, m)?)?;
    m.add_class::<prefix::BlockHashes>()?;
    m.add_class::<prefix::PrefixIndex>()?;
    m.add_class::<prefix::BranchPoints>()?;
    m.add_class::<scorer::Scorer>()?;
    m.add_function(wrap_pyfunction!(registry::plugin_registry, m)?)?;
    m.add_function(wrap_pyfunction!(registry::refused_plugins, m)?)?;
    m.add_class::<kv_ownership::KvOwnership>()?;
    m.add_function(wrap_pyfunction!(kv_ownership::token_block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(kv_ownership::block_hash_key, m)?)?;
    m.add_class::<fairq::FairQueue>()?;
    m.add_class::<front::Front>()?;
    m.add_class::<rotation::Rotation>()?;
    m.add_function(wrap_pyfunction!(front::render::render_prompt, m)?)?;
    Ok(())
}
