//! The two streams of changes a client can follow: a key's holders
//! (`Client.watch`, [`KeyWatch`]) and an election's leaders
//! (`Client.observe`, [`LeaderWatch`]).

use std::sync::Arc;

use fencelock::HolderChange;
use pyo3::prelude::*;

use crate::{convert::to_json, errors::py_err, runtime::call};

/// The holder changes of a key.
#[pyclass(frozen, module = "fencelock._native")]
pub(crate) struct KeyWatch {
    watch: Arc<tokio::sync::Mutex<fencelock::Watch>>,
    blocking: bool,
}

impl KeyWatch {
    pub(crate) fn new(watch: fencelock::Watch, blocking: bool) -> Self {
        KeyWatch {
            watch: Arc::new(tokio::sync::Mutex::new(watch)),
            blocking,
        }
    }
}

#[pymethods]
impl KeyWatch {
    /// The next change as a dict (`kind`: `acquired`, `released` or
    /// `expired`; `key`, `owner`, `token`; `lease`, the new lease, for
    /// `acquired`), or `None` when the watch ended.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = Arc::clone(&self.watch);
        call(py, self.blocking, async move {
            let change = watch.lock().await.next().await;
            let (kind, id, lease) = match change.transpose().map_err(py_err)? {
                None => return Ok(None),
                Some(HolderChange::Acquired(info)) => {
                    let id =
                        fencelock::LeaseId::new(info.key.clone(), info.owner.clone(), info.token);
                    ("acquired", id, Some(info))
                }
                Some(HolderChange::Released(id)) => ("released", id, None),
                Some(HolderChange::Expired(id)) => ("expired", id, None),
                // A kind of change this binding does not know yet ends the
                // watch rather than being misreported.
                Some(_) => return Ok(None),
            };
            Ok(Some(to_json(serde_json::json!({
                "kind": kind,
                "key": id.key,
                "owner": id.owner,
                "token": id.token.get(),
                "lease": lease,
            }))?))
        })
    }
}

/// The changes of an election's leader.
#[pyclass(frozen, module = "fencelock._native")]
pub(crate) struct LeaderWatch {
    watch: Arc<tokio::sync::Mutex<fencelock::LeaderWatch>>,
    blocking: bool,
}

impl LeaderWatch {
    pub(crate) fn new(watch: fencelock::LeaderWatch, blocking: bool) -> Self {
        LeaderWatch {
            watch: Arc::new(tokio::sync::Mutex::new(watch)),
            blocking,
        }
    }
}

#[pymethods]
impl LeaderWatch {
    /// The next change as a dict (`{"elected": leader}` or `{"vacant":
    /// {...}}`), or `None` when the watch ended.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = Arc::clone(&self.watch);
        call(py, self.blocking, async move {
            let change = watch.lock().await.next().await;
            match change {
                None => Ok(None),
                Some(Err(e)) => Err(py_err(e)),
                Some(Ok(fencelock::LeaderChange::Elected(leader))) => {
                    Ok(Some(to_json(serde_json::json!({ "elected": leader }))?))
                }
                Some(Ok(fencelock::LeaderChange::Vacant {
                    previous_term,
                    expired,
                })) => Ok(Some(to_json(serde_json::json!({
                    "vacant": {"previous_term": previous_term.get(), "expired": expired}
                }))?)),
                Some(Ok(_)) => Ok(None),
            }
        })
    }
}
