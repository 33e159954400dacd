//! Python arguments to the core's values and back: seconds, JSON text,
//! the options of an acquisition, and core values handed over as dicts.

use std::time::Duration;

use fencelock::{AcquireSettings, Error};
use pyo3::prelude::*;

/// Seconds (already a float in the Python layer) as a `Duration`; a
/// negative, NaN or infinite value is the core's error for that argument.
pub(crate) fn seconds(what: &str, value: f64) -> fencelock::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        let message = format!("{what} must be a finite number of seconds >= 0, not {value}");
        if what == "ttl" {
            Error::InvalidTtl(message)
        } else {
            Error::InvalidArgument(message)
        }
    })
}

pub(crate) fn json(
    what: &str,
    text: Option<String>,
) -> fencelock::Result<Option<serde_json::Value>> {
    text.map(|text| {
        serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{what} is not JSON: {e}")))
    })
    .transpose()
}

/// The options of `lock`, `lock_all`, `semaphore` and `campaign`, converted
/// once; each request type takes the ones it has.
pub(crate) struct Options {
    ttl: Option<Duration>,
    wait: Duration,
    kind: Option<String>,
    data: Option<serde_json::Value>,
    renew_every: Option<Duration>,
}

impl Options {
    pub(crate) fn new(
        ttl: Option<f64>,
        wait: f64,
        kind: Option<String>,
        data: Option<String>,
        renew_every: Option<f64>,
    ) -> fencelock::Result<Self> {
        Ok(Self {
            ttl: ttl.map(|t| seconds("ttl", t)).transpose()?,
            wait: seconds("wait", wait)?,
            kind,
            data: json("data", data)?,
            renew_every: renew_every.map(|p| seconds("renew_every", p)).transpose()?,
        })
    }

    /// `request` with these settings.
    pub(crate) fn apply<R: AcquireSettings>(self, mut request: R) -> R {
        request = request.wait(self.wait);
        if let Some(ttl) = self.ttl {
            request = request.ttl(ttl);
        }
        if let Some(kind) = self.kind {
            request = request.kind(kind);
        }
        if let Some(data) = self.data {
            request = request.data(data);
        }
        if let Some(period) = self.renew_every {
            request = request.renew_every(period);
        }
        request
    }
}

/// A `serde_json::Value` as the Python value `json.loads` would give.
fn to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// Serializable core values (leases, statistics, leaders) handed to
/// Python as dicts.
pub(crate) struct Json(serde_json::Value);

impl<'py> IntoPyObject<'py> for Json {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(to_py(py, &self.0)?.into_bound(py))
    }
}

pub(crate) fn to_json<T: serde::Serialize>(value: T) -> PyResult<Json> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}
