//! The core's errors as the exceptions of `fencelock._errors`.

use fencelock::Error;
use pyo3::{exceptions::PyException, intern, prelude::*, PyErrArguments};

/// The exception of `fencelock._errors` for a core error: the class is
/// chosen there by the core's stable `code` (the words of the CLI and the
/// REST API), with the loss reason for a lost lock and whether a client
/// was closed.
pub(crate) fn py_err(error: Error) -> PyErr {
    let reason = match &error {
        Error::LockLost { reason, .. } => Some(reason.as_str()),
        _ => None,
    };
    let closed = matches!(error, Error::ClientClosed);
    exception(error.code(), error.to_string(), reason, closed)
}

/// A core error as the exception `fencelock._errors` chooses for it, made
/// only when Python first needs it: on the event loop's thread (or the
/// caller's, for the sync API), never on the runtime's, which do not take
/// the GIL. Python raises the instance it is given as itself, its class a
/// subclass of `Exception`.
struct CoreError {
    code: &'static str,
    message: String,
    reason: Option<&'static str>,
    closed: bool,
}

impl PyErrArguments for CoreError {
    fn arguments(self, py: Python<'_>) -> Py<PyAny> {
        let made = py
            .import(intern!(py, "fencelock._errors"))
            .and_then(|errors| {
                errors.call_method1(
                    intern!(py, "_from_core"),
                    (self.code, self.message, self.reason, self.closed),
                )
            });
        match made {
            Ok(exception) => exception.unbind(),
            Err(import_failed) => import_failed.into_value(py).into_any(),
        }
    }
}

pub(crate) fn exception(
    code: &'static str,
    message: String,
    reason: Option<&'static str>,
    closed: bool,
) -> PyErr {
    PyErr::new::<PyException, _>(CoreError {
        code,
        message,
        reason,
        closed,
    })
}

pub(crate) fn core<T>(result: fencelock::Result<T>) -> PyResult<T> {
    result.map_err(py_err)
}
