//! `connect` and the client's calls. Elections are asked for here, as
//! Python's `Client` offers them, and made in [`crate::election`].

use fencelock::{FencingToken, LockClient, Owner};
use pyo3::prelude::*;

use crate::{
    convert::{seconds, to_json, Options},
    election,
    errors::{core, py_err},
    guard::{Guard, MultiLock},
    runtime::{call, runtime},
    watch::KeyWatch,
};

/// A client of one backend (`connect`).
#[pyclass(frozen, weakref, module = "fencelock._native")]
pub(crate) struct Client {
    inner: LockClient,
    blocking: bool,
}

/// Opens the backend `url` names (every URL the CLI accepts).
#[pyfunction]
#[pyo3(signature = (url, *, owner=None, ttl=None, op_timeout=None, blocking=false))]
pub(crate) fn connect(
    py: Python<'_>,
    url: String,
    owner: Option<String>,
    ttl: Option<f64>,
    op_timeout: Option<f64>,
    blocking: bool,
) -> PyResult<Bound<'_, PyAny>> {
    call(py, blocking, async move {
        let made = async {
            let backend = fencelock::open_backend(&url).await?;
            let mut builder = LockClient::builder(backend);
            if let Some(owner) = owner {
                builder = builder.owner(Owner::new(owner)?);
            }
            if let Some(ttl) = ttl {
                builder = builder.ttl(seconds("ttl", ttl)?);
            }
            if let Some(timeout) = op_timeout {
                builder = builder.op_timeout(seconds("op_timeout", timeout)?);
            }
            builder.build()
        };
        let inner = core(made.await)?;
        Ok(Client { inner, blocking })
    })
}

#[pymethods]
impl Client {
    /// The owner this client's locks are taken as.
    #[getter]
    fn owner(&self) -> String {
        self.inner.owner().to_string()
    }

    /// Acquires `key` (see `fencelock.Client.acquire`).
    #[pyo3(signature = (key, *, ttl=None, wait=0.0, owner=None, kind=None, data=None,
                        min_token=None, renew_every=None, hold_at_least=None, shared=false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        key: String,
        ttl: Option<f64>,
        wait: f64,
        owner: Option<String>,
        kind: Option<String>,
        data: Option<String>,
        min_token: Option<u64>,
        renew_every: Option<f64>,
        hold_at_least: Option<f64>,
        shared: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let acquired = async {
                let options = Options::new(ttl, wait, kind, data, renew_every)?;
                let mut request = options.apply(client.lock(key).shared(shared));
                if let Some(owner) = owner {
                    request = request.owner(Owner::new(owner)?);
                }
                if let Some(floor) = min_token {
                    request = request.min_token(FencingToken(floor));
                }
                if let Some(delay) = hold_at_least {
                    request = request.hold_at_least(seconds("hold_at_least", delay)?);
                }
                request.acquire().await
            };
            Ok(Guard::lock(core(acquired.await)?, blocking))
        })
    }

    /// Acquires every key of `keys`, all or none (`lock_all`).
    #[pyo3(signature = (keys, *, ttl=None, wait=0.0, kind=None, data=None, renew_every=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn acquire_all<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        ttl: Option<f64>,
        wait: f64,
        kind: Option<String>,
        data: Option<String>,
        renew_every: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let acquired = async {
                let options = Options::new(ttl, wait, kind, data, renew_every)?;
                options.apply(client.lock_all(keys)).acquire().await
            };
            Ok(MultiLock::new(core(acquired.await)?, blocking))
        })
    }

    /// Takes one permit of the counting semaphore `name`.
    #[pyo3(signature = (name, permits, *, ttl=None, wait=0.0, kind=None, data=None, renew_every=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn acquire_permit<'py>(
        &self,
        py: Python<'py>,
        name: String,
        permits: u32,
        ttl: Option<f64>,
        wait: f64,
        kind: Option<String>,
        data: Option<String>,
        renew_every: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let acquired = async {
                let options = Options::new(ttl, wait, kind, data, renew_every)?;
                options
                    .apply(client.semaphore(name, permits))
                    .acquire()
                    .await
            };
            let permit = core(acquired.await)?;
            let slot = permit.slot();
            Ok((Guard::lock(permit.into_guard(), blocking), slot))
        })
    }

    /// The holders of semaphore `name` (dicts: slot, key, owner, token…).
    fn permit_holders<'py>(
        &self,
        py: Python<'py>,
        name: String,
        permits: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            let holders = core(client.semaphore(name, permits).holders().await)?;
            let listed: Vec<serde_json::Value> = holders
                .into_iter()
                .map(|h| serde_json::json!({"slot": h.slot, "lease": h.lease}))
                .collect();
            to_json(listed)
        })
    }

    /// Campaigns in election `name`: the leader's guard, whose token is
    /// the term.
    #[pyo3(signature = (name, *, ttl=None, wait=None, value=None, renew_every=None))]
    fn campaign<'py>(
        &self,
        py: Python<'py>,
        name: String,
        ttl: Option<f64>,
        wait: Option<f64>,
        value: Option<String>,
        renew_every: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let elected = election::campaign(&client, name, ttl, wait, value, renew_every);
            Ok(Guard::leader(core(elected.await)?, blocking))
        })
    }

    /// The current leader of election `name` (a dict), or `None`.
    fn leader<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, election::leader(client, name))
    }

    /// Follows the leaders of election `name`.
    fn observe<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, election::observe(client, name, blocking))
    }

    /// Re-attaches to the lease of `owner` on `key` granted with `token`
    /// (one a guard detached, here or in another process): a guard renewed
    /// by this client once the backend confirmed the lease is current.
    #[pyo3(signature = (key, owner, token, *, ttl=None, renew_every=None))]
    fn resume<'py>(
        &self,
        py: Python<'py>,
        key: String,
        owner: String,
        token: u64,
        ttl: Option<f64>,
        renew_every: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let resumed = async {
                let mut request = client.resume(key, Owner::new(owner)?, FencingToken(token));
                if let Some(ttl) = ttl {
                    request = request.ttl(seconds("ttl", ttl)?);
                }
                if let Some(period) = renew_every {
                    request = request.renew_every(seconds("renew_every", period)?);
                }
                request.await
            };
            Ok(Guard::lock(core(resumed.await)?, blocking))
        })
    }

    /// Follows the holders of `key`.
    fn watch<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            Ok(KeyWatch::new(core(client.watch(&key).await)?, blocking))
        })
    }

    /// The current lease on `key` (a dict), or `None`.
    fn inspect<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            core(client.inspect(&key).await)?.map(to_json).transpose()
        })
    }

    /// Every unexpired lease on exactly `key` (the writer or the readers).
    fn holders<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            to_json(core(client.holders(&key).await)?)
        })
    }

    /// The current leases whose key starts with `prefix`.
    #[pyo3(signature = (prefix=None))]
    fn list<'py>(&self, py: Python<'py>, prefix: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            to_json(core(client.list(prefix.as_deref()).await)?)
        })
    }

    /// The backend's operator statistics (a dict).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            to_json(core(client.stats().await)?)
        })
    }

    /// Removes whatever lease `key` has; the removed lease, or `None`.
    fn force_release<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            core(client.force_release(&key).await)?
                .map(to_json)
                .transpose()
        })
    }

    /// Deletes expired lease records; how many.
    fn cleanup<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(
            py,
            self.blocking,
            async move { core(client.cleanup().await) },
        )
    }

    /// Whether `token` is still the live lease on `key`.
    fn validate<'py>(
        &self,
        py: Python<'py>,
        key: String,
        token: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            core(client.validate(&key, FencingToken(token)).await)
        })
    }

    /// Releases every lock the client holds and refuses new ones.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move { core(client.close().await) })
    }

    /// `close()`, blocking without the GIL, whatever the client's API:
    /// what the package's `atexit` hook runs for every client still open
    /// when the interpreter exits normally, so that the locks they hold
    /// are released before the process ends (as Node.js does in its
    /// `'exit'` event), not left to the collection of guards during
    /// shutdown, which may not finish.
    fn close_at_exit(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.inner.clone();
        py.detach(|| runtime().block_on(client.close()))
            .map_err(py_err)
    }
}
