//! The runtime the core runs on, and the bridge of its futures to Python:
//! an asyncio future of the running loop settled on the loop's own thread,
//! or a blocking call without the GIL for the synchronous API.

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
};

use pyo3::{intern, prelude::*, sync::PyOnceLock, IntoPyObjectExt};

use crate::errors::exception;

/// The runtime the core runs on: every client's renewer, every lock call
/// and every background release, on threads of its own. Its threads never
/// take the GIL to hand a result over (see [`call`]), so a Python thread
/// holding the GIL delays a result, never a renewal.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
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
pub(crate) fn call<'py, F, T>(
    py: Python<'py>,
    blocking: bool,
    work: F,
) -> PyResult<Bound<'py, PyAny>>
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
