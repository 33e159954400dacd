//! `fencelock._native`: the Rust client of the `fencelock` crate for Python.
//!
//! Only conversions live here: Python arguments to the core's requests,
//! the core's futures to asyncio awaitables (or to blocking calls for the
//! synchronous API), and the core's errors to the exception classes of
//! `fencelock._errors`, chosen by `Error::code()`. Acquisition, renewal,
//! loss deadlines and release are the core's, unchanged. The idiomatic
//! Python API (`async with`, `run`, the sync client) is the pure-Python
//! package around this module.
//!
//! One module per concern:
//! - [`runtime`], the core's runtime and the bridge of its futures to
//!   asyncio (or to blocking calls);
//! - [`client`], `connect` and the client's calls;
//! - [`guard`], a held lock or leadership, and locks on several keys;
//! - [`election`], campaigns and the leader;
//! - [`watch`], the changes of a key's holders and of an election's leaders;
//! - [`fence`], fences;
//! - [`errors`], the core's errors as `fencelock._errors` exceptions;
//! - [`convert`], seconds, JSON and the options of an acquisition.

mod client;
mod convert;
mod election;
mod errors;
mod fence;
mod guard;
mod runtime;
mod watch;

use pyo3::prelude::*;

use crate::{convert::seconds, errors::py_err, runtime::runtime};

/// Waits (without the GIL, at most `bound` seconds) until the releases
/// that collected guards sent in the background are done; `True` when none
/// is left. The package's `atexit` hook runs it after closing the clients
/// still open, so that a guard collected just before the exit is released.
#[pyfunction]
fn wait_for_background_releases(py: Python<'_>, bound: f64) -> PyResult<bool> {
    let bound = seconds("bound", bound).map_err(py_err)?;
    Ok(py.detach(|| runtime().block_on(fencelock::wait_for_background_releases(bound))))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(fence::open_fence, m)?)?;
    m.add_function(wrap_pyfunction!(wait_for_background_releases, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<guard::Guard>()?;
    m.add_class::<guard::MultiLock>()?;
    m.add_class::<watch::LeaderWatch>()?;
    m.add_class::<watch::KeyWatch>()?;
    m.add_class::<fence::PyFence>()?;
    Ok(())
}
