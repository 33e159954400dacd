//! `fencelock._native`: the Rust client of the `fencelock` crate for Python.
//!
//! Only conversions live here: Python arguments to the core's requests,
//! the core's futures to asyncio awaitables (or to blocking calls for the
//! synchronous API), and the core's errors to the exception classes of
//! `fencelock._errors`, chosen by `Error::code()`. Acquisition, renewal,
//! loss deadlines and release are the core's, unchanged. The idiomatic
//! Python API (`async with`, `run`, the sync client) is the pure-Python
//! package around this module.

use std::{
    any::Any,
    cell::RefCell,
    future::Future,
    io::{Read, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak},
    task::{Context, Poll},
    time::Duration,
};

use fencelock::{
    Error, Fence, FencingToken, GuardHandle, HolderChange, Leadership, LockClient, LockGuard,
    LockMode, LockRequest, MultiGuard, Owner,
};
use pyo3::{
    exceptions::PyException, intern, prelude::*, sync::PyOnceLock, types::PyDict, IntoPyObjectExt,
    PyErrArguments,
};

/// The runtime the core runs on: every client's renewer, every lock call
/// and every background release, on threads of its own. Its threads never
/// take the GIL to hand a result over (see [`call`]), so a Python thread
/// holding the GIL delays a result, never a renewal.
fn runtime() -> &'static tokio::runtime::Runtime {
    static LOCKS: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    LOCKS.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fencelock")
            .enable_all()
            .build()
            .expect("a tokio runtime starts (threads and timers are available)")
    })
}

/// A future whose panic is caught and handed back as its message, so that
/// a panic in the core becomes a Python exception rather than a lost
/// result (asyncio) or an unwinding through the interpreter (sync).
struct Caught<F>(Pin<Box<F>>);

impl<F: Future> Future for Caught<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let work = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(payload.as_ref()))),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// What a call's work ended with, still a Rust value: it becomes a Python
/// object only on the event loop's thread, with the GIL the loop holds.
trait Outcome: Send {
    fn into_py(self: Box<Self>, py: Python<'_>) -> PyResult<Bound<'_, PyAny>>;
}

impl<T> Outcome for PyResult<T>
where
    T: for<'a> IntoPyObject<'a> + Send,
{
    fn into_py(self: Box<Self>, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        (*self)?.into_bound_py_any(py)
    }
}

/// A panic inside the core, as the `internal` error of `fencelock._errors`.
struct Panicked(String);

impl Panicked {
    fn into_err(self) -> PyErr {
        exception(
            "internal",
            format!("the call failed inside the Rust library: {}", self.0),
            None,
            false,
        )
    }
}

impl Outcome for Panicked {
    fn into_py(self: Box<Self>, _py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Err(self.into_err())
    }
}

/// A finished call waiting for its event loop: the asyncio future and the
/// outcome to settle it with.
struct Done {
    future: Py<PyAny>,
    outcome: Box<dyn Outcome>,
}

/// The calls one event loop waits for.
#[derive(Default)]
struct Pending {
    done: Vec<Done>,
    /// The loop was closed (its reader dropped): later outcomes are
    /// dropped on the runtime's threads, guards released in the background.
    closed: bool,
}

/// One event loop's completion queue and the socket pair that wakes it.
/// Both ends live as long as this value, which the loop's reader and the
/// calls still running share: a write never meets a closed peer or a
/// reused descriptor, and the last of them to go closes both.
struct Wakeup {
    pending: Mutex<Pending>,
    reader: UnixStream,
    writer: UnixStream,
}

impl Wakeup {
    fn new() -> std::io::Result<Self> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        Ok(Self {
            pending: Mutex::default(),
            reader,
            writer,
        })
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding it leaves a queue that is still whole.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a finished call (on a runtime thread); only the first of a
    /// burst writes the byte that wakes the loop.
    fn complete(&self, done: Done) {
        let first = {
            let mut pending = self.pending();
            if pending.closed {
                None
            } else {
                pending.done.push(done);
                Some(pending.done.len() == 1)
            }
        };
        // A full socket buffer (`WouldBlock`) already holds a wake-up; the
        // loop drains the queue whatever the count of bytes, so a failed
        // write has nothing left to do.
        if first == Some(true) {
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// The reader of one event loop (`loop.add_reader`): the loop holds the
/// only reference, so closing the loop drops it.
#[pyclass(frozen, module = "fencelock._native")]
struct LoopWaker(Arc<Wakeup>);

#[pymethods]
impl LoopWaker {
    /// Settles every finished call's future, on the loop's thread.
    fn __call__(&self, py: Python<'_>) {
        // Empty the socket before taking the queue: an outcome queued after
        // the take has written a byte this loop has not read yet.
        let mut bytes = [0; 64];
        while matches!((&self.0.reader).read(&mut bytes), Ok(n) if n == bytes.len()) {}
        let done = std::mem::take(&mut self.0.pending().done);
        for Done { future, outcome } in done {
            let future = future.bind(py);
            let settled = match outcome.into_py(py) {
                Ok(value) => future.call_method1(intern!(py, "set_result"), (value,)),
                Err(error) => {
                    future.call_method1(intern!(py, "set_exception"), (error.into_value(py),))
                }
            };
            // Only a future its awaiter cancelled refuses a result, and the
            // abort (see `call`) already dropped that call's work.
            if let Err(refused) = settled {
                let cancelled = future
                    .call_method0(intern!(py, "cancelled"))
                    .and_then(|c| c.is_truthy())
                    .unwrap_or(false);
                if !cancelled {
                    refused.write_unraisable(py, Some(future));
                }
            }
        }
    }
}

impl Drop for LoopWaker {
    fn drop(&mut self) {
        let orphans = {
            let mut pending = self.0.pending();
            pending.closed = true;
            std::mem::take(&mut pending.done)
        };
        drop(orphans);
    }
}

/// The `add_done_callback` of a call's future: aborts the call's task once
/// the future is done. After a result the task has already ended and the
/// abort does nothing; after a cancellation it drops the work at once
/// (a waiting acquire stops waiting).
#[pyclass(frozen, module = "fencelock._native")]
struct Abort(tokio::task::AbortHandle);

#[pymethods]
impl Abort {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        self.0.abort();
    }
}

thread_local! {
    /// The event loop last seen running on this thread and its queue (a
    /// thread runs one loop at a time; the loop is held so that its
    /// identity cannot be taken by a new object).
    static CURRENT: RefCell<Option<(Py<PyAny>, Weak<Wakeup>)>> = const { RefCell::new(None) };
}

/// The running event loop and its queue, made and registered with the loop
/// on its first call.
fn running_loop(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Arc<Wakeup>)> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let event_loop = GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()?;
    let known = CURRENT.with_borrow(|current| {
        let (seen, wakeup) = current.as_ref()?;
        let wakeup = wakeup.upgrade().filter(|_| seen.is(&event_loop))?;
        let open = !wakeup.pending().closed;
        open.then_some(wakeup)
    });
    if let Some(wakeup) = known {
        return Ok((event_loop, wakeup));
    }
    let wakeup = Arc::new(Wakeup::new()?);
    let waker = LoopWaker(Arc::clone(&wakeup));
    event_loop.call_method1(
        intern!(py, "add_reader"),
        (wakeup.reader.as_raw_fd(), waker),
    )?;
    let seen = Some((event_loop.clone().unbind(), Arc::downgrade(&wakeup)));
    // The loop replaced is released after the borrow: its decref may run
    // Python code that calls back here.
    let replaced = CURRENT.with_borrow_mut(|current| std::mem::replace(current, seen));
    drop(replaced);
    Ok((event_loop, wakeup))
}

/// Runs `work` on [`runtime`] as an asyncio future of the running loop, or
/// to completion with the GIL released when `blocking` (the synchronous
/// API). The runtime's thread only queues the outcome and wakes the loop;
/// the loop's reader ([`LoopWaker`]) converts it and settles the future.
fn call<'py, F, T>(py: Python<'py>, blocking: bool, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let work = Caught(Box::pin(work));
    if blocking {
        let value = py
            .detach(|| runtime().block_on(work))
            .map_err(|panic| Panicked(panic).into_err())??;
        return value.into_bound_py_any(py);
    }
    let (event_loop, wakeup) = running_loop(py)?;
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let settles = future.clone().unbind();
    let task = runtime().spawn(async move {
        let outcome: Box<dyn Outcome> = match work.await {
            Ok(result) => Box::new(result),
            Err(panic) => Box::new(Panicked(panic)),
        };
        wakeup.complete(Done {
            future: settles,
            outcome,
        });
    });
    future.call_method1(
        intern!(py, "add_done_callback"),
        (Abort(task.abort_handle()),),
    )?;
    Ok(future)
}

/// The exception of `fencelock._errors` for a core error: the class is
/// chosen there by the core's stable `code` (the words of the CLI and the
/// REST API), with the loss reason for a lost lock and whether a client
/// was closed.
fn py_err(error: Error) -> PyErr {
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

fn exception(
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

fn core<T>(result: fencelock::Result<T>) -> PyResult<T> {
    result.map_err(py_err)
}

/// Seconds (already a float in the Python layer) as a `Duration`; a
/// negative, NaN or infinite value is the core's error for that argument.
fn seconds(what: &str, value: f64) -> fencelock::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        let message = format!("{what} must be a finite number of seconds >= 0, not {value}");
        if what == "ttl" {
            Error::InvalidTtl(message)
        } else {
            Error::InvalidArgument(message)
        }
    })
}

fn json(what: &str, text: Option<String>) -> fencelock::Result<Option<serde_json::Value>> {
    text.map(|text| {
        serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{what} is not JSON: {e}")))
    })
    .transpose()
}

/// The options of `lock`, `lock_all`, `semaphore` and `campaign`, converted
/// once; each request type takes the ones it has.
struct Options {
    ttl: Option<Duration>,
    wait: Duration,
    kind: Option<String>,
    data: Option<serde_json::Value>,
    renew_every: Option<Duration>,
}

impl Options {
    fn new(
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

    fn lock<'a>(self, mut request: LockRequest<'a>) -> LockRequest<'a> {
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
struct Json(serde_json::Value);

impl<'py> IntoPyObject<'py> for Json {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(to_py(py, &self.0)?.into_bound(py))
    }
}

fn to_json<T: serde::Serialize>(value: T) -> PyResult<Json> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

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

/// What a guard holds: a lock, or an election's leadership (a lock that
/// can also publish the leader's value).
enum Holding {
    Lock(LockGuard),
    Leader(Leadership),
}

impl Holding {
    async fn release(self) -> fencelock::Result<()> {
        match self {
            Holding::Lock(guard) => guard.release().await,
            Holding::Leader(leadership) => leadership.resign().await,
        }
    }

    fn detach(self) {
        match self {
            Holding::Lock(guard) => guard.detach(),
            Holding::Leader(leadership) => leadership.into_guard().detach(),
        }
    }
}

/// A client of one backend (`connect`).
#[pyclass(frozen, weakref, module = "fencelock._native")]
struct Client {
    inner: LockClient,
    blocking: bool,
}

/// Opens the backend `url` names (every URL the CLI accepts).
#[pyfunction]
#[pyo3(signature = (url, *, owner=None, ttl=None, op_timeout=None, blocking=false))]
fn connect(
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
                let mut request = options.lock(client.lock(key).shared(shared));
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
            Ok(Guard::new(core(acquired.await)?, blocking))
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
                let mut request = client.lock_all(keys).wait(options.wait);
                if let Some(ttl) = options.ttl {
                    request = request.ttl(ttl);
                }
                if let Some(kind) = options.kind {
                    request = request.kind(kind);
                }
                if let Some(data) = options.data {
                    request = request.data(data);
                }
                if let Some(period) = options.renew_every {
                    request = request.renew_every(period);
                }
                request.acquire().await
            };
            let all = core(acquired.await)?;
            Ok(MultiLock {
                tokens: all
                    .tokens()
                    .into_iter()
                    .map(|(key, token)| (key.to_string(), token.get()))
                    .collect(),
                all: Arc::new(Held::new(all)),
                blocking,
            })
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
                let mut request = client.semaphore(name, permits).wait(options.wait);
                if let Some(ttl) = options.ttl {
                    request = request.ttl(ttl);
                }
                if let Some(kind) = options.kind {
                    request = request.kind(kind);
                }
                if let Some(data) = options.data {
                    request = request.data(data);
                }
                if let Some(period) = options.renew_every {
                    request = request.renew_every(period);
                }
                request.acquire().await
            };
            let permit = core(acquired.await)?;
            let slot = permit.slot();
            Ok((Guard::new(permit.into_guard(), blocking), slot))
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
            let elected = async {
                let mut election = client.election(name);
                if let Some(ttl) = ttl {
                    election = election.ttl(seconds("ttl", ttl)?);
                }
                if let Some(value) = json("value", value)? {
                    election = election.value(value);
                }
                if let Some(period) = renew_every {
                    election = election.renew_every(seconds("renew_every", period)?);
                }
                match wait {
                    Some(wait) => election.campaign_for(seconds("wait", wait)?).await,
                    None => election.campaign().await,
                }
            };
            let leadership = core(elected.await)?;
            Ok(Guard::holding(
                leadership.handle(),
                Holding::Leader(leadership),
                blocking,
            ))
        })
    }

    /// The current leader of election `name` (a dict), or `None`.
    fn leader<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        call(py, self.blocking, async move {
            let leader = core(client.election(name).leader().await)?;
            leader.map(to_json).transpose()
        })
    }

    /// Follows the leaders of election `name`.
    fn observe<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let watch = core(client.election(name).observe().await)?;
            Ok(LeaderWatch {
                watch: Arc::new(tokio::sync::Mutex::new(watch)),
                blocking,
            })
        })
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
            Ok(Guard::new(core(resumed.await)?, blocking))
        })
    }

    /// Follows the holders of `key`.
    fn watch<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let blocking = self.blocking;
        call(py, blocking, async move {
            let watch = core(client.watch(&key).await)?;
            Ok(KeyWatch {
                watch: Arc::new(tokio::sync::Mutex::new(watch)),
                blocking,
            })
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

/// A held lock: the core's guard, renewed by the client's renewer.
#[pyclass(frozen, module = "fencelock._native")]
struct Guard {
    handle: GuardHandle,
    guard: Arc<Held<Holding>>,
    blocking: bool,
}

impl Guard {
    fn new(guard: LockGuard, blocking: bool) -> Self {
        Self::holding(guard.handle(), Holding::Lock(guard), blocking)
    }

    fn holding(handle: GuardHandle, holding: Holding, blocking: bool) -> Self {
        Self {
            handle,
            guard: Arc::new(Held::new(holding)),
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
        let guard = Arc::clone(&self.guard);
        call(py, self.blocking, async move {
            match guard.take().await {
                Some(guard) => core(guard.release().await),
                None => Ok(()),
            }
        })
    }

    /// Drops the guard as Rust drops one: renewal stops and the lease is
    /// released in the background (what a collected guard does too).
    fn discard(&self, py: Python<'_>) {
        drop(self.guard.take_blocking(py).map(Held::new));
    }

    /// Stops renewing and leaves the lease to expire (or to `resume`, or
    /// another process that renews or releases it by owner and token).
    fn detach(&self, py: Python<'_>) {
        if let Some(guard) = self.guard.take_blocking(py) {
            guard.detach();
        }
    }

    /// Publishes `value` (JSON text) as the leader's value: a leadership
    /// only, while still leader.
    fn proclaim<'py>(&self, py: Python<'py>, value: String) -> PyResult<Bound<'py, PyAny>> {
        let guard = Arc::clone(&self.guard);
        let lease = self.handle.lease().clone();
        call(py, self.blocking, async move {
            let Some(value) = core(json("value", Some(value)))? else {
                return Ok(());
            };
            match guard.0.lock().await.as_ref() {
                Some(Holding::Leader(leadership)) => core(leadership.proclaim(value).await),
                Some(Holding::Lock(_)) => Err(py_err(Error::InvalidArgument(
                    "only an election's leadership can proclaim".into(),
                ))),
                None => Err(py_err(Error::not_held(&lease))),
            }
        })
    }
}

/// Locks on several keys, taken all or none.
#[pyclass(frozen, module = "fencelock._native")]
struct MultiLock {
    all: Arc<Held<MultiGuard>>,
    tokens: Vec<(String, u64)>,
    blocking: bool,
}

impl MultiLock {
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

/// The changes of an election's leader.
#[pyclass(frozen, module = "fencelock._native")]
struct LeaderWatch {
    watch: Arc<tokio::sync::Mutex<fencelock::LeaderWatch>>,
    blocking: bool,
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

/// The holder changes of a key.
#[pyclass(frozen, module = "fencelock._native")]
struct KeyWatch {
    watch: Arc<tokio::sync::Mutex<fencelock::Watch>>,
    blocking: bool,
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

/// The fence kept by a backend (`open_fence`).
#[pyclass(frozen, name = "Fence", module = "fencelock._native")]
struct PyFence {
    fence: Arc<dyn Fence>,
    blocking: bool,
}

/// Opens the fence kept by the backend `url` names.
#[pyfunction]
#[pyo3(signature = (url, *, blocking=false))]
fn open_fence(py: Python<'_>, url: String, blocking: bool) -> PyResult<Bound<'_, PyAny>> {
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
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(open_fence, m)?)?;
    m.add_function(wrap_pyfunction!(wait_for_background_releases, m)?)?;
    m.add_class::<Client>()?;
    m.add_class::<Guard>()?;
    m.add_class::<MultiLock>()?;
    m.add_class::<LeaderWatch>()?;
    m.add_class::<KeyWatch>()?;
    m.add_class::<PyFence>()?;
    Ok(())
}
