//! Held leases: a lock or a leadership ([`Guard`], one class for both over
//! the facade's [`HeldLease`]) and locks on several keys ([`MultiLock`]).
//! A guard whose Python object is collected without a release is released
//! in the background ([`Held`]).

use std::{future::Future, sync::Arc};

use fencelock::{Error, GuardHandle, HeldLease, Leadership, LockGuard, MultiGuard};
use pyo3::{prelude::*, types::PyDict};

use crate::{
    convert::{json, seconds},
    errors::{core, py_err},
    runtime::{call, runtime},
};

/// A held lease of the core (guard, multi-key guard) whose Python object
/// may be collected without a release: dropping it inside the runtime
/// lets the core stop its renewal and release it in the background, as a
/// dropped guard does in Rust. Outside a runtime the core could only stop
/// renewing and leave the lease to expire.
///
/// An async mutex: a leader's `proclaim` uses its leadership across an
/// await, and a `release` meanwhile must wait for it rather than find
/// nothing to release.
struct Held<T>(tokio::sync::Mutex<Option<T>>);

impl<T> Held<T> {
    fn new(value: T) -> Self {
        Self(tokio::sync::Mutex::new(Some(value)))
    }

    /// The lease, once: `None` after a release or detach.
    async fn take(&self) -> Option<T> {
        self.0.lock().await.take()
    }

    /// [`take`](Held::take) from a Python thread (never a runtime's), with
    /// the GIL released while a `proclaim` finishes.
    fn take_blocking(&self, py: Python<'_>) -> Option<T>
    where
        T: Send,
    {
        py.detach(|| self.0.blocking_lock().take())
    }

    /// Reads the lease while held, for the accessors that do not await
    /// (no one holds a multi-key guard's lock across an await).
    fn with<R>(&self, read: impl FnOnce(&T) -> R) -> Option<R> {
        self.0.try_lock().ok()?.as_ref().map(read)
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        let held = self.0.get_mut().take();
        if held.is_some() {
            let _inside = runtime().enter();
            drop(held);
        }
    }
}

/// A held lock: the core's guard, renewed by the client's renewer.
#[pyclass(frozen, module = "fencelock._native")]
pub(crate) struct Guard {
    handle: GuardHandle,
    held: Arc<Held<HeldLease>>,
    blocking: bool,
}

impl Guard {
    /// A guard of a lock.
    pub(crate) fn lock(guard: LockGuard, blocking: bool) -> Self {
        Self::new(guard.handle(), HeldLease::from(guard), blocking)
    }

    /// A guard of an election's leadership.
    pub(crate) fn leader(leadership: Leadership, blocking: bool) -> Self {
        Self::new(leadership.handle(), HeldLease::from(leadership), blocking)
    }

    fn new(handle: GuardHandle, held: HeldLease, blocking: bool) -> Self {
        Self {
            handle,
            held: Arc::new(Held::new(held)),
            blocking,
        }
    }
}

/// Waits for `lost`, at most `timeout` seconds when given: the reason, or
/// `None` when the time ran out.
async fn lost_within<F: Future<Output = fencelock::LossReason>>(
    lost: F,
    timeout: Option<f64>,
) -> PyResult<Option<&'static str>> {
    match timeout {
        None => Ok(Some(lost.await.as_str())),
        Some(limit) => {
            let limit = core(seconds("timeout", limit))?;
            Ok(tokio::time::timeout(limit, lost)
                .await
                .ok()
                .map(|reason| reason.as_str()))
        }
    }
}

#[pymethods]
impl Guard {
    /// The lock's key.
    #[getter]
    fn key(&self) -> String {
        self.handle.key().to_string()
    }

    /// The owner the lock is held as.
    #[getter]
    fn owner(&self) -> String {
        self.handle.owner().to_string()
    }

    /// The grant's fencing token.
    #[getter]
    fn token(&self) -> u64 {
        self.handle.token().get()
    }

    /// `exclusive` or `shared` (a reader of a read-write lock).
    #[getter]
    fn mode(&self) -> &'static str {
        self.handle.mode().as_str()
    }

    /// The requested lease length, in seconds.
    #[getter]
    fn ttl(&self) -> f64 {
        self.handle.ttl().as_secs_f64()
    }

    /// The lease's end as the backend last reported it (Unix seconds).
    #[getter]
    fn expires_at(&self) -> f64 {
        self.handle.expires_at().timestamp_millis() as f64 / 1000.0
    }

    /// Whether the lease is still trusted locally.
    #[getter]
    fn is_valid(&self) -> bool {
        self.handle.is_valid()
    }

    /// Seconds the lease is still trusted locally (0 once lost).
    #[getter]
    fn remaining(&self) -> f64 {
        self.handle.remaining().as_secs_f64()
    }

    /// Why the lock was lost, once it has been.
    #[getter]
    fn loss_reason(&self) -> Option<&'static str> {
        self.handle.loss_reason().map(|r| r.as_str())
    }

    /// Raises `LockLost` unless the lease is still trusted.
    fn check(&self) -> PyResult<()> {
        core(self.handle.check())
    }

    /// Completes with the loss reason when the lock is lost.
    #[pyo3(signature = (timeout=None))]
    fn lost<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let lost = self.handle.lost();
        call(py, self.blocking, lost_within(lost, timeout))
    }

    /// Renews now, besides the background renewal.
    fn renew<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        call(py, self.blocking, async move { core(handle.renew().await) })
    }

    /// Stops renewal and releases the lease (once; later calls do nothing).
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let held = Arc::clone(&self.held);
        call(py, self.blocking, async move {
            match held.take().await {
                Some(held) => core(held.release().await),
                None => Ok(()),
            }
        })
    }

    /// Drops the guard as Rust drops one: renewal stops and the lease is
    /// released in the background (what a collected guard does too).
    fn discard(&self, py: Python<'_>) {
        drop(self.held.take_blocking(py).map(Held::new));
    }

    /// Stops renewing and leaves the lease to expire (or to `resume`, or
    /// another process that renews or releases it by owner and token).
    fn detach(&self, py: Python<'_>) {
        if let Some(held) = self.held.take_blocking(py) {
            held.detach();
        }
    }

    /// Publishes `value` (JSON text) as the leader's value: a leadership
    /// only, while still leader.
    fn proclaim<'py>(&self, py: Python<'py>, value: String) -> PyResult<Bound<'py, PyAny>> {
        let held = Arc::clone(&self.held);
        let lease = self.handle.lease().clone();
        call(py, self.blocking, async move {
            let Some(value) = core(json("value", Some(value)))? else {
                return Ok(());
            };
            match held.0.lock().await.as_ref() {
                Some(held) => core(held.proclaim(value).await),
                None => Err(py_err(Error::not_held(&lease))),
            }
        })
    }
}

/// Locks on several keys, taken all or none.
#[pyclass(frozen, module = "fencelock._native")]
pub(crate) struct MultiLock {
    all: Arc<Held<MultiGuard>>,
    tokens: Vec<(String, u64)>,
    blocking: bool,
}

impl MultiLock {
    pub(crate) fn new(all: MultiGuard, blocking: bool) -> Self {
        MultiLock {
            tokens: all
                .tokens()
                .into_iter()
                .map(|(key, token)| (key.to_string(), token.get()))
                .collect(),
            all: Arc::new(Held::new(all)),
            blocking,
        }
    }

    /// The guards' shared view while held, for the read-only accessors.
    fn with<T>(&self, read: impl FnOnce(&MultiGuard) -> T) -> Option<T> {
        self.all.with(read)
    }
}

#[pymethods]
impl MultiLock {
    /// Each key's fencing token.
    #[getter]
    fn tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let tokens = PyDict::new(py);
        for (key, token) in &self.tokens {
            tokens.set_item(key, token)?;
        }
        Ok(tokens)
    }

    /// Whether every lease is still trusted locally.
    #[getter]
    fn is_valid(&self) -> bool {
        self.with(MultiGuard::is_valid).unwrap_or(false)
    }

    /// Raises `LockLost` unless every lease is still trusted.
    fn check(&self) -> PyResult<()> {
        match self.with(MultiGuard::check) {
            Some(checked) => core(checked),
            None => Err(py_err(Error::ClientClosed)),
        }
    }

    /// Completes with `(key, reason)` when the first of the locks is lost.
    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(lost) = self.with(MultiGuard::lost) else {
            return Err(py_err(Error::ClientClosed));
        };
        call(py, self.blocking, async move {
            let (key, reason) = lost.await;
            Ok((key.to_string(), reason.as_str()))
        })
    }

    /// Releases every lease (once).
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let all = Arc::clone(&self.all);
        call(py, self.blocking, async move {
            match all.take().await {
                Some(all) => core(all.release().await),
                None => Ok(()),
            }
        })
    }
}
