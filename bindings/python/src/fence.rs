//! Fences: what a protected resource uses to refuse stale tokens.

use std::sync::Arc;

use fencelock::{Error, Fence, FencingToken, LockMode};
use pyo3::prelude::*;

use crate::{
    errors::{core, py_err},
    runtime::call,
};

/// The fence kept by a backend (`open_fence`).
#[pyclass(frozen, name = "Fence", module = "fencelock._native")]
pub(crate) struct PyFence {
    fence: Arc<dyn Fence>,
    blocking: bool,
}

/// Opens the fence kept by the backend `url` names.
#[pyfunction]
#[pyo3(signature = (url, *, blocking=false))]
pub(crate) fn open_fence(
    py: Python<'_>,
    url: String,
    blocking: bool,
) -> PyResult<Bound<'_, PyAny>> {
    call(py, blocking, async move {
        let fence = core(fencelock::open_fence(&url).await)?;
        Ok(PyFence { fence, blocking })
    })
}

#[pymethods]
impl PyFence {
    /// Admits `token` for `resource`, or raises `Stale`.
    fn admit<'py>(
        &self,
        py: Python<'py>,
        resource: String,
        token: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fence = Arc::clone(&self.fence);
        call(py, self.blocking, async move {
            core(fence.admit(&resource, FencingToken(token)).await)
        })
    }

    /// Admits `token` of a lease held in `mode` (`exclusive` or `shared`).
    fn admit_shared<'py>(
        &self,
        py: Python<'py>,
        resource: String,
        token: u64,
        mode: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fence = Arc::clone(&self.fence);
        call(py, self.blocking, async move {
            let mode = match mode.as_str() {
                "exclusive" => LockMode::Exclusive,
                "shared" => LockMode::Shared,
                other => {
                    return Err(py_err(Error::InvalidArgument(format!(
                        "mode must be \"exclusive\" or \"shared\", not {:?}",
                        fencelock::shorten(other)
                    ))))
                }
            };
            core(
                fence
                    .admit_shared(&resource, FencingToken(token), mode)
                    .await,
            )
        })
    }

    /// The highest token admitted for `resource`, or `None`.
    fn highest<'py>(&self, py: Python<'py>, resource: String) -> PyResult<Bound<'py, PyAny>> {
        let fence = Arc::clone(&self.fence);
        call(py, self.blocking, async move {
            Ok(core(fence.highest(&resource).await)?.map(FencingToken::get))
        })
    }

    /// Forgets `resource` (`Fence::reset`): its highest tokens and its
    /// stored value; the highest token it had, or `None`.
    fn reset<'py>(&self, py: Python<'py>, resource: String) -> PyResult<Bound<'py, PyAny>> {
        let fence = Arc::clone(&self.fence);
        call(py, self.blocking, async move {
            Ok(core(fence.reset(&resource).await)?.map(FencingToken::get))
        })
    }
}
