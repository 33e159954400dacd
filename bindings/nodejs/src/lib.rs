//! The native half of the `fencelock` npm package: napi-rs classes over the
//! `fencelock` facade. Everything here converts (types, errors, futures);
//! the locking, renewal and loss deadline are the Rust client's. The
//! JavaScript half (`index.js`, `index.mjs`, `index.d.ts`) adds what is
//! idiom in Node.js: the `'lost'` event, `AbortSignal` in `run`, typed error
//! classes.
//!
//! Errors cross as JavaScript `Error`s whose message is
//! `fencelock:<code>:<message>`; the JavaScript half turns them into its
//! typed classes. `<code>` is [`fencelock::Error::code`] (the words of the
//! CLI's `--json` errors and of the REST API), except that a wait that ended
//! with the key held is `not_acquired`, the name the package promises.

// No `forbid(unsafe_code)` or `missing_docs` here: napi-derive's generated
// glue is unsafe code with undocumented items.

use std::{
    collections::HashMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use fencelock::{
    CancellationToken, FencingToken, GuardHandle, HolderChange, Leadership, LockGuard, LockMode,
    Owner,
};
use futures_util::FutureExt;
use napi::{
    bindgen_prelude::{BigInt, Either, Env, FromNapiValue, ToNapiValue},
    threadsafe_function::{
        ErrorStrategy, ThreadSafeCallContext, ThreadsafeFunction, ThreadsafeFunctionCallMode,
    },
    JsError, JsFunction, JsUnknown,
};
use napi_derive::napi;
use tokio::runtime::Handle;

type Result<T> = napi::Result<T>;

/// napi-rs's runtime, built here instead of by napi-rs (which would start
/// one worker per core): with one worker, a call's task and the backend
/// connection's task it talks to run on the same thread, so a call wakes
/// one runtime thread and then the event loop, and never hops between
/// workers (docs/benchmarks.md, "The Node.js package").
#[napi::module_init]
fn init_runtime() {
    let workers = std::env::var("FENCELOCK_NODE_WORKERS")
        .ok()
        .and_then(|w| w.parse::<usize>().ok())
        .filter(|&w| w > 0)
        .unwrap_or(1);
    // On failure napi-rs builds its default runtime, which then fails the
    // same way on the first call, as a JavaScript exception.
    if let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("fencelock-node")
        .enable_all()
        .build()
    {
        napi::bindgen_prelude::create_custom_tokio_runtime(runtime);
    }
}

/// A call's outcome, made into a JavaScript value on the event loop.
type Outcome = Box<dyn FnOnce(Env) -> Result<JsUnknown> + Send>;

/// The one threadsafe function of a Node.js environment (made by `init`,
/// which `index.js` calls once): it carries every asynchronous call's
/// outcome, with the call's id, to the promise `index.js` made for it. A
/// call thus creates one task and no promise or threadsafe function in
/// native code (napi-rs's `async fn` makes a promise, a threadsafe function
/// and two tasks per call).
struct Replies(ThreadsafeFunction<(f64, Outcome), ErrorStrategy::Fatal>);

/// Makes this environment's reply channel: `settle(id, error, value)` is
/// called on the event loop with each call's outcome. The channel does not
/// keep Node.js running by itself; `hold` says when calls are pending.
#[napi]
pub fn init(env: Env, settle: JsFunction) -> Result<()> {
    let mut replies =
        settle.create_threadsafe_function(0, |ctx: ThreadSafeCallContext<(f64, Outcome)>| {
            let (id, outcome) = ctx.value;
            let id = ctx.env.create_double(id)?.into_unknown();
            let undefined = ctx.env.get_undefined()?.into_unknown();
            Ok(match outcome(ctx.env) {
                Ok(value) => vec![id, undefined, value],
                Err(e) => vec![id, JsError::from(e).into_unknown(ctx.env), undefined],
            })
        })?;
    replies.unref(&env)?;
    env.set_instance_data(Replies(replies), (), |_| {})
}

/// Keeps Node.js running while calls are pending (`pending`), or not.
#[napi]
pub fn hold(env: Env, pending: bool) -> Result<()> {
    let replies = replies(&env)?;
    if pending {
        replies.refer(&env)
    } else {
        replies.unref(&env)
    }
}

fn replies(
    env: &Env,
) -> Result<&'static mut ThreadsafeFunction<(f64, Outcome), ErrorStrategy::Fatal>> {
    match env.get_instance_data::<Replies>()? {
        Some(replies) => Ok(&mut replies.0),
        None => Err(napi::Error::from_reason(
            "fencelock: the native module was loaded without index.js (init was not called)",
        )),
    }
}

/// Runs `work` on the runtime and settles the call `id` of `index.js` with
/// its outcome; a panic in `work` rejects the call instead of crossing into
/// Node.js.
fn start<T, F>(env: &Env, id: f64, work: F) -> Result<()>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let replies = replies(env)?.clone();
    napi::bindgen_prelude::spawn(async move {
        let outcome: Outcome = match AssertUnwindSafe(work).catch_unwind().await {
            Ok(Ok(value)) => Box::new(move |env| to_js(env, value)),
            Ok(Err(e)) => Box::new(move |_| Err(e)),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Box::new(move |_| {
                    Err(napi::Error::from_reason(format!(
                        "the call panicked inside the Rust library: {what}"
                    )))
                })
            }
        };
        replies.call((id, outcome), ThreadsafeFunctionCallMode::NonBlocking);
    });
    Ok(())
}

fn to_js<T: ToNapiValue>(env: Env, value: T) -> Result<JsUnknown> {
    // SAFETY: `env` is the environment of the thread this runs on (the
    // event loop, in the threadsafe function's callback), which is all
    // both conversions require.
    unsafe { JsUnknown::from_napi_value(env.raw(), T::to_napi_value(env.raw(), value)?) }
}

/// A duration from JavaScript: milliseconds, or a string such as `'30s'`.
type JsDuration = Either<f64, String>;

/// The tagged JavaScript error of a fencelock error.
fn js_error(e: fencelock::Error) -> napi::Error {
    let code = match &e {
        fencelock::Error::Timeout { .. } => "not_acquired",
        _ => e.code(),
    };
    let kind = match &e {
        fencelock::Error::LockLost { .. } => "lost",
        _ => "",
    };
    napi::Error::from_reason(format!("fencelock:{code}:{kind}:{e}"))
}

/// A duration option: finite, non-negative milliseconds (`Infinity` only
/// where `forever` allows it), or a duration string parsed like the CLI's.
fn duration(value: &JsDuration, what: &str, forever: bool) -> Result<Duration> {
    match value {
        Either::A(ms) if ms.is_infinite() && *ms > 0.0 && forever => Ok(Duration::MAX),
        Either::A(ms) if ms.is_finite() && *ms >= 0.0 => {
            Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| bad(what, &ms.to_string()))
        }
        Either::A(ms) => Err(bad(what, &ms.to_string())),
        Either::B(text) => fencelock::parse_duration(text).map_err(|_| bad(what, text)),
    }
}

fn bad(what: &str, value: &str) -> napi::Error {
    let message = format!("{what} {value:?} is not a duration (milliseconds, or e.g. '30s')");
    js_error(if what == "ttl" {
        fencelock::Error::InvalidTtl(message)
    } else {
        fencelock::Error::InvalidArgument(message)
    })
}

fn opt_duration(value: &Option<JsDuration>, what: &str, forever: bool) -> Result<Option<Duration>> {
    value
        .as_ref()
        .map(|v| duration(v, what, forever))
        .transpose()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn token_from_js(token: BigInt) -> Result<FencingToken> {
    let (negative, value, lossless) = token.get_u64();
    if negative || !lossless {
        return Err(js_error(fencelock::Error::InvalidToken(
            "a fencing token is an unsigned 64-bit integer".into(),
        )));
    }
    Ok(FencingToken(value))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Options of `connect`.
#[napi(object)]
pub struct ConnectOptions {
    /// The owner name locks are taken as (default: generated, host and pid).
    pub owner: Option<String>,
    /// The default lease length of this client's locks.
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// The bound on each backend call.
    #[napi(ts_type = "number | string")]
    pub op_timeout: Option<JsDuration>,
}

/// Options of an acquisition.
#[napi(object)]
pub struct LockOptions {
    /// Lease length: milliseconds or a duration string (default: the
    /// client's, 30s).
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// How long to wait for a held key (default 0: one try; `Infinity`:
    /// forever).
    #[napi(ts_type = "number | string")]
    pub wait: Option<JsDuration>,
    /// Take the lock as this owner instead of the client's.
    pub owner: Option<String>,
    /// A free-form label shown by inspect, list and stats.
    pub kind: Option<String>,
    /// JSON data stored with the lease.
    pub data: Option<serde_json::Value>,
    /// Renewal period (default: a third of the TTL).
    #[napi(ts_type = "number | string")]
    pub renew_every: Option<JsDuration>,
    /// Lock delay: a release before this keeps the key until it has passed.
    #[napi(ts_type = "number | string")]
    pub hold_at_least: Option<JsDuration>,
}

/// A lease as the backend reports it.
#[napi(object)]
pub struct LockInfo {
    /// The key.
    pub key: String,
    /// Its holder.
    pub owner: String,
    /// The grant's fencing token.
    pub token: BigInt,
    /// The holder's label.
    pub kind: Option<String>,
    /// The holder's data.
    pub data: Option<serde_json::Value>,
    /// When it was granted (backend clock).
    pub acquired_at: DateTime<Utc>,
    /// When it ends unless renewed (backend clock).
    pub expires_at: DateTime<Utc>,
    /// Milliseconds left when read.
    pub expires_in_ms: f64,
    /// `'exclusive'` or `'shared'`.
    pub mode: String,
}

impl From<fencelock::LockInfo> for LockInfo {
    fn from(info: fencelock::LockInfo) -> Self {
        LockInfo {
            key: info.key.as_str().to_owned(),
            owner: info.owner.as_str().to_owned(),
            token: BigInt::from(info.token.get()),
            kind: info.kind,
            data: info.data,
            acquired_at: info.acquired_at,
            expires_at: info.expires_at,
            expires_in_ms: millis(info.expires_in),
            mode: info.mode.as_str().to_owned(),
        }
    }
}

/// What a backend holds.
#[napi(object)]
pub struct Stats {
    /// Unexpired leases.
    pub held: f64,
    /// Unexpired leases by kind (`''` for none).
    pub held_by_kind: HashMap<String, f64>,
    /// Unexpired leases by owner.
    pub held_by_owner: HashMap<String, f64>,
    /// Mean time the current leases have been held, in seconds.
    pub avg_hold_seconds: Option<f64>,
    /// Longest time a current lease has been held, in seconds.
    pub max_hold_seconds: Option<f64>,
    /// Expired leases still stored (what cleanup deletes).
    pub expired_not_cleaned: f64,
}

fn counts(map: std::collections::BTreeMap<String, u64>) -> HashMap<String, f64> {
    map.into_iter().map(|(k, v)| (k, v as f64)).collect()
}

/// The current leader of an election.
#[napi(object)]
pub struct Leader {
    /// The leader's owner name.
    pub owner: String,
    /// The value it published.
    pub value: Option<serde_json::Value>,
    /// Its term (fencing token).
    pub term: BigInt,
    /// Milliseconds left on its lease when read.
    pub expires_in_ms: f64,
}

/// Connects to the backend a URL names.
#[napi]
pub fn connect(env: Env, id: f64, url: String, options: Option<ConnectOptions>) -> Result<()> {
    start(&env, id, connecting(url, options))
}

async fn connecting(url: String, options: Option<ConnectOptions>) -> Result<Client> {
    let backend = fencelock::open_backend(&url).await.map_err(js_error)?;
    let mut builder = fencelock::LockClient::builder(backend);
    if let Some(options) = options {
        if let Some(owner) = options.owner {
            builder = builder.owner(Owner::new(owner).map_err(js_error)?);
        }
        if let Some(ttl) = opt_duration(&options.ttl, "ttl", false)? {
            builder = builder.ttl(ttl);
        }
        if let Some(t) = opt_duration(&options.op_timeout, "opTimeout", false)? {
            builder = builder.op_timeout(t);
        }
    }
    Ok(Client {
        inner: builder.build().map_err(js_error)?,
    })
}

/// Opens the fence kept by the backend a URL names.
#[napi]
pub fn open_fence(env: Env, id: f64, url: String) -> Result<()> {
    start(&env, id, async move {
        Ok(Fence {
            inner: fencelock::open_fence(&url).await.map_err(js_error)?,
        })
    })
}

/// A lock client (native half).
#[napi]
pub struct Client {
    inner: fencelock::LockClient,
}

fn request<'a>(
    mut request: fencelock::LockRequest<'a>,
    options: Option<LockOptions>,
) -> Result<fencelock::LockRequest<'a>> {
    let Some(o) = options else {
        return Ok(request);
    };
    if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
        request = request.ttl(ttl);
    }
    if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
        request = request.wait(wait);
    }
    if let Some(owner) = o.owner {
        request = request.owner(Owner::new(owner).map_err(js_error)?);
    }
    if let Some(kind) = o.kind {
        request = request.kind(kind);
    }
    if let Some(data) = o.data {
        request = request.data(data);
    }
    if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
        request = request.renew_every(period);
    }
    if let Some(delay) = opt_duration(&o.hold_at_least, "holdAtLeast", false)? {
        request = request.hold_at_least(delay);
    }
    Ok(request)
}

async fn permit(
    client: fencelock::LockClient,
    name: String,
    permits: u32,
    options: Option<LockOptions>,
) -> Result<Guard> {
    let mut sem = client.semaphore(name, permits);
    if let Some(o) = options {
        if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
            sem = sem.ttl(ttl);
        }
        if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
            sem = sem.wait(wait);
        }
        if let Some(kind) = o.kind {
            sem = sem.kind(kind);
        }
        if let Some(data) = o.data {
            sem = sem.data(data);
        }
        if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
            sem = sem.renew_every(period);
        }
    }
    let permit = sem.acquire().await.map_err(js_error)?;
    let slot = permit.slot();
    Ok(Guard::new(permit.into_guard(), Some(slot)))
}

async fn lock_all(
    client: fencelock::LockClient,
    keys: Vec<String>,
    options: Option<LockOptions>,
) -> Result<MultiGuard> {
    let mut multi = client.lock_all(keys);
    if let Some(o) = options {
        if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
            multi = multi.ttl(ttl);
        }
        if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
            multi = multi.wait(wait);
        }
        if let Some(kind) = o.kind {
            multi = multi.kind(kind);
        }
        if let Some(data) = o.data {
            multi = multi.data(data);
        }
        if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
            multi = multi.renew_every(period);
        }
    }
    let guard = multi.acquire().await.map_err(js_error)?;
    Ok(MultiGuard {
        guard: Mutex::new(Some(guard)),
        runtime: Handle::try_current().ok(),
        done: CancellationToken::new(),
    })
}

#[napi]
impl Client {
    /// The owner name this client's locks are taken as.
    #[napi(getter)]
    pub fn owner(&self) -> String {
        self.inner.owner().as_str().to_owned()
    }

    /// Acquires `key` (exclusive).
    #[napi]
    pub fn acquire(
        &self,
        env: Env,
        id: f64,
        key: String,
        options: Option<LockOptions>,
    ) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let guard = request(client.lock(key), options)?
                .acquire()
                .await
                .map_err(js_error)?;
            Ok(Guard::new(guard, None))
        })
    }

    /// Acquires the read-write lock `key` as a reader (`shared`) or writer.
    #[napi]
    pub fn acquire_rw(
        &self,
        env: Env,
        id: f64,
        key: String,
        shared: bool,
        options: Option<LockOptions>,
    ) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let rw = client.rwlock(key);
            let base = if shared { rw.read() } else { rw.write() };
            let guard = request(base, options)?.acquire().await.map_err(js_error)?;
            Ok(Guard::new(guard, None))
        })
    }

    /// Takes one of the `permits` permits of the semaphore `name`.
    #[napi]
    pub fn acquire_permit(
        &self,
        env: Env,
        id: f64,
        name: String,
        permits: u32,
        options: Option<LockOptions>,
    ) -> Result<()> {
        start(&env, id, permit(self.inner.clone(), name, permits, options))
    }

    /// Acquires every key of `keys`, all or none.
    #[napi]
    pub fn lock_all(
        &self,
        env: Env,
        id: f64,
        keys: Vec<String>,
        options: Option<LockOptions>,
    ) -> Result<()> {
        start(&env, id, lock_all(self.inner.clone(), keys, options))
    }
    /// The current lease of `key`, if any.
    #[napi]
    pub fn inspect(&self, env: Env, id: f64, key: String) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let info = client.inspect(&key).await.map_err(js_error)?;
            Ok(info.map(LockInfo::from))
        })
    }

    /// Every current lease (whose key starts with `prefix`).
    #[napi]
    pub fn list(&self, env: Env, id: f64, prefix: Option<String>) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let leases = client.list(prefix.as_deref()).await.map_err(js_error)?;
            Ok(leases.into_iter().map(LockInfo::from).collect::<Vec<_>>())
        })
    }

    /// Counts of the backend's leases.
    #[napi]
    pub fn stats(&self, env: Env, id: f64) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let s = client.stats().await.map_err(js_error)?;
            Ok(Stats {
                held: s.held as f64,
                held_by_kind: counts(s.held_by_kind),
                held_by_owner: counts(s.held_by_owner),
                avg_hold_seconds: s.avg_hold_seconds,
                max_hold_seconds: s.max_hold_seconds,
                expired_not_cleaned: s.expired_not_cleaned as f64,
            })
        })
    }

    /// Ends the lease of `key` whoever holds it; the lease it ended, if any.
    #[napi]
    pub fn force_release(&self, env: Env, id: f64, key: String) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let info = client.force_release(&key).await.map_err(js_error)?;
            Ok(info.map(LockInfo::from))
        })
    }

    /// Deletes expired leases; how many.
    #[napi]
    pub fn cleanup(&self, env: Env, id: f64) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            Ok(client.cleanup().await.map_err(js_error)? as f64)
        })
    }

    /// Re-attaches to the lease of `owner` on `key` granted with `token`
    /// (one a guard detached, here or in another process): a guard renewed
    /// by this client, once the backend confirmed the lease is current.
    #[napi]
    pub fn resume(
        &self,
        env: Env,
        id: f64,
        key: String,
        owner: String,
        token: BigInt,
        options: Option<ResumeOptions>,
    ) -> Result<()> {
        let owner = Owner::new(owner).map_err(js_error)?;
        let token = token_from_js(token)?;
        let client = self.inner.clone();
        start(&env, id, async move {
            let mut request = client.resume(key, owner, token);
            if let Some(o) = options {
                if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
                    request = request.ttl(ttl);
                }
                if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
                    request = request.renew_every(period);
                }
            }
            Ok(Guard::new(request.await.map_err(js_error)?, None))
        })
    }

    /// The holder changes of `key` from now on.
    #[napi]
    pub fn watch(&self, env: Env, id: f64, key: String) -> Result<()> {
        let client = self.inner.clone();
        start(&env, id, async move {
            let watch = client.watch(&key).await.map_err(js_error)?;
            Ok(KeyWatch {
                watch: Arc::new(tokio::sync::Mutex::new(watch)),
                closed: CancellationToken::new(),
            })
        })
    }

    /// The election `name`.
    #[napi]
    pub fn election(&self, name: String, options: Option<ElectionOptions>) -> Result<Election> {
        let mut election = self.inner.election(name);
        if let Some(o) = options {
            if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
                election = election.ttl(ttl);
            }
            if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
                election = election.wait(wait);
            }
            if let Some(value) = o.value {
                election = election.value(value);
            }
        }
        Ok(Election { inner: election })
    }

    /// Releases every lock this client holds and stops its renewer.
    #[napi]
    pub fn close(&self, env: Env, id: f64) -> Result<()> {
        let client = self.inner.clone();
        start(
            &env,
            id,
            async move { client.close().await.map_err(js_error) },
        )
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

/// A held lock (native half): renewed in the background until released,
/// lost or collected.
#[napi]
pub struct Guard {
    /// An async mutex: `proclaim` uses the leadership across an await, and
    /// a `release` meanwhile must wait for it rather than find nothing.
    /// Shared with the task of a call in flight, which may outlive the
    /// JavaScript object.
    guard: Arc<tokio::sync::Mutex<Option<Holding>>>,
    handle: GuardHandle,
    slot: Option<u32>,
    /// The binding's runtime, where a collected guard's release is sent.
    runtime: Option<Handle>,
    /// Cancelled on release or collection: ends a pending `waitLost`, so
    /// that a released or collected guard leaves no task behind.
    done: CancellationToken,
}

impl Guard {
    fn new(guard: LockGuard, slot: Option<u32>) -> Self {
        Self::holding(guard.handle(), Holding::Lock(guard), slot)
    }

    fn holding(handle: GuardHandle, holding: Holding, slot: Option<u32>) -> Self {
        Guard {
            handle,
            guard: Arc::new(tokio::sync::Mutex::new(Some(holding))),
            slot,
            runtime: Handle::try_current().ok(),
            done: CancellationToken::new(),
        }
    }
}

/// Dropped by the garbage collector (the JavaScript object became
/// unreachable without `release()`): stops renewing and releases the lease
/// in the background, on the binding's runtime. A call still in flight
/// holds the lock and finishes with the lease (on the runtime).
impl Drop for Guard {
    fn drop(&mut self) {
        self.done.cancel();
        if let Ok(mut guard) = self.guard.try_lock() {
            drop_on(self.runtime.as_ref(), guard.take());
        }
    }
}

/// Drops `guard` inside `runtime`, where the Rust guard's drop sends its
/// release. When Node.js exits, napi-rs shuts the runtime down before the
/// last objects are collected: the guard then stops renewing, nothing is
/// sent, and the lease ends by expiry.
fn drop_on<G>(runtime: Option<&Handle>, guard: Option<G>) {
    match runtime {
        Some(runtime) => {
            let _entered = runtime.enter();
            drop(guard);
        }
        None => drop(guard),
    }
}

/// Settles the call `id` with the loss reason, or with `null` once `done`
/// is cancelled.
fn wait_lost(
    env: &Env,
    id: f64,
    lost: impl Future<Output = String> + Send + 'static,
    done: CancellationToken,
) -> Result<()> {
    start(env, id, async move {
        Ok(tokio::select! {
            reason = lost => Some(reason),
            () = done.cancelled() => None,
        })
    })
}

#[napi]
impl Guard {
    /// The key.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.handle.key().as_str().to_owned()
    }

    /// The owner the lease is held as.
    #[napi(getter)]
    pub fn owner(&self) -> String {
        self.handle.owner().as_str().to_owned()
    }

    /// The grant's fencing token.
    #[napi(getter)]
    pub fn token(&self) -> BigInt {
        BigInt::from(self.handle.token().get())
    }

    /// `'exclusive'` or `'shared'`.
    #[napi(getter)]
    pub fn mode(&self) -> String {
        self.handle.mode().as_str().to_owned()
    }

    /// The semaphore slot, for a permit.
    #[napi(getter)]
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// When the lease ends on the backend unless renewed.
    #[napi(getter)]
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.handle.expires_at()
    }

    /// Milliseconds this holder can still trust the lease (0 once lost).
    #[napi(getter)]
    pub fn remaining_ms(&self) -> f64 {
        millis(self.handle.remaining())
    }

    /// Whether the lease can still be trusted.
    #[napi(getter)]
    pub fn is_valid(&self) -> bool {
        self.handle.is_valid()
    }

    /// Why the lock was lost, once it was.
    #[napi(getter)]
    pub fn loss_reason(&self) -> Option<String> {
        self.handle.loss_reason().map(|r| r.as_str().to_owned())
    }

    /// Throws the lock-lost error once the lease cannot be trusted.
    #[napi(catch_unwind)]
    pub fn check(&self) -> Result<()> {
        self.handle.check().map_err(js_error)
    }

    /// Renews now.
    #[napi]
    pub fn renew(&self, env: Env, id: f64) -> Result<()> {
        let handle = self.handle.clone();
        start(
            &env,
            id,
            async move { handle.renew().await.map_err(js_error) },
        )
    }

    /// Settles the call `id` with the loss reason; with `null` once released.
    #[napi]
    pub fn wait_lost(&self, env: Env, id: f64) -> Result<()> {
        let lost = self.handle.lost();
        wait_lost(
            &env,
            id,
            async move { lost.await.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Stops renewal and releases the lease; a second call does nothing.
    #[napi]
    pub fn release(&self, env: Env, id: f64) -> Result<()> {
        let (guard, done) = (self.guard.clone(), self.done.clone());
        start(&env, id, async move {
            let guard = guard.lock().await.take();
            done.cancel();
            match guard {
                Some(guard) => guard.release().await.map_err(js_error),
                None => Ok(()),
            }
        })
    }

    /// Stops renewing and leaves the lease to expire, or to `resume` by
    /// key, owner and token (in this process or another).
    #[napi]
    pub fn detach(&self, env: Env, id: f64) -> Result<()> {
        let (guard, done) = (self.guard.clone(), self.done.clone());
        start(&env, id, async move {
            let guard = guard.lock().await.take();
            done.cancel();
            if let Some(guard) = guard {
                guard.detach();
            }
            Ok(())
        })
    }

    /// Publishes `value` as the leader's value (a leadership only).
    #[napi]
    pub fn proclaim(&self, env: Env, id: f64, value: serde_json::Value) -> Result<()> {
        let (guard, handle) = (self.guard.clone(), self.handle.clone());
        start(&env, id, async move {
            match guard.lock().await.as_ref() {
                Some(Holding::Leader(leadership)) => {
                    leadership.proclaim(value).await.map_err(js_error)
                }
                Some(Holding::Lock(_)) => Err(js_error(fencelock::Error::InvalidArgument(
                    "only an election's leadership can proclaim".into(),
                ))),
                None => Err(js_error(fencelock::Error::not_held(handle.lease()))),
            }
        })
    }
}

/// Locks on several keys, taken all or none (native half).
#[napi]
pub struct MultiGuard {
    guard: Mutex<Option<fencelock::MultiGuard>>,
    runtime: Option<Handle>,
    done: CancellationToken,
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        self.done.cancel();
        drop_on(self.runtime.as_ref(), lock(&self.guard).take());
    }
}

#[napi]
impl MultiGuard {
    /// Each key's fencing token (empty once released).
    #[napi(getter)]
    pub fn tokens(&self) -> HashMap<String, BigInt> {
        lock(&self.guard)
            .as_ref()
            .map(|g| {
                g.tokens()
                    .into_iter()
                    .map(|(k, t)| (k.as_str().to_owned(), BigInt::from(t.get())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether every lease can still be trusted.
    #[napi(getter)]
    pub fn is_valid(&self) -> bool {
        lock(&self.guard).as_ref().is_some_and(|g| g.is_valid())
    }

    /// Throws the lock-lost error once any lease cannot be trusted.
    #[napi(catch_unwind)]
    pub fn check(&self) -> Result<()> {
        match lock(&self.guard).as_ref() {
            Some(g) => g.check().map_err(js_error),
            None => Ok(()),
        }
    }

    /// Settles the call `id` with the first loss reason; with `null` once
    /// released.
    #[napi]
    pub fn wait_lost(&self, env: Env, id: f64) -> Result<()> {
        let Some(lost) = lock(&self.guard).as_ref().map(|g| g.lost()) else {
            return start(&env, id, async { Ok(None::<String>) });
        };
        wait_lost(
            &env,
            id,
            async move { lost.await.1.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Releases every lease.
    #[napi]
    pub fn release(&self, env: Env, id: f64) -> Result<()> {
        let guard = lock(&self.guard).take();
        self.done.cancel();
        start(&env, id, async move {
            match guard {
                Some(guard) => guard.release().await.map_err(js_error),
                None => Ok(()),
            }
        })
    }
}

/// Options of an election.
#[napi(object)]
pub struct ElectionOptions {
    /// The leader's lease length.
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// How long `campaign` waits (default: forever).
    #[napi(ts_type = "number | string")]
    pub wait: Option<JsDuration>,
    /// The value the leader publishes.
    pub value: Option<serde_json::Value>,
}

/// A leader election (native half).
#[napi]
pub struct Election {
    inner: fencelock::Election,
}

#[napi]
impl Election {
    /// Waits to become the leader.
    #[napi]
    pub fn campaign(&self, env: Env, id: f64) -> Result<()> {
        let election = self.inner.clone();
        start(&env, id, async move {
            let leadership = election.campaign().await.map_err(js_error)?;
            Ok(Guard::holding(
                leadership.handle(),
                Holding::Leader(leadership),
                None,
            ))
        })
    }

    /// The current leader, if any.
    #[napi]
    pub fn leader(&self, env: Env, id: f64) -> Result<()> {
        let election = self.inner.clone();
        start(&env, id, async move {
            let leader = election.leader().await.map_err(js_error)?;
            Ok(leader.map(Leader::from))
        })
    }

    /// The current leader (first) and every change from now on.
    #[napi]
    pub fn observe(&self, env: Env, id: f64) -> Result<()> {
        let election = self.inner.clone();
        start(&env, id, async move {
            let watch = election.observe().await.map_err(js_error)?;
            Ok(LeaderObserver {
                watch: Arc::new(tokio::sync::Mutex::new(watch)),
                closed: CancellationToken::new(),
            })
        })
    }
}

impl From<fencelock::Leader> for Leader {
    fn from(l: fencelock::Leader) -> Self {
        Leader {
            owner: l.owner.as_str().to_owned(),
            value: l.value,
            term: BigInt::from(l.term.get()),
            expires_in_ms: millis(l.expires_in),
        }
    }
}

/// A change of an election's leader.
#[napi(object)]
pub struct LeaderChange {
    /// `'elected'` or `'vacant'`.
    pub kind: String,
    /// The new leader (`'elected'`).
    pub leader: Option<Leader>,
    /// The term that ended (`'vacant'`).
    pub previous_term: Option<BigInt>,
    /// Whether that term's lease expired rather than being released (`'vacant'`).
    pub expired: Option<bool>,
}

/// The changes of an election's leader (native half of `observe`).
#[napi]
pub struct LeaderObserver {
    watch: Arc<tokio::sync::Mutex<fencelock::LeaderWatch>>,
    closed: CancellationToken,
}

#[napi]
impl LeaderObserver {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi]
    pub fn next(&self, env: Env, id: f64) -> Result<()> {
        let (watch, closed) = (self.watch.clone(), self.closed.clone());
        start(&env, id, async move {
            let mut watch = watch.lock().await;
            let change = tokio::select! {
                change = watch.next() => change,
                () = closed.cancelled() => None,
            };
            leader_change(change)
        })
    }

    /// Stops observing: a pending and every later `next` give `null`.
    #[napi]
    pub fn close(&self) {
        self.closed.cancel();
    }
}

fn leader_change(
    change: Option<fencelock::Result<fencelock::LeaderChange>>,
) -> Result<Option<LeaderChange>> {
    Ok(match change.transpose().map_err(js_error)? {
        None => None,
        Some(fencelock::LeaderChange::Elected(leader)) => Some(LeaderChange {
            kind: "elected".into(),
            leader: Some(leader.into()),
            previous_term: None,
            expired: None,
        }),
        Some(fencelock::LeaderChange::Vacant {
            previous_term,
            expired,
        }) => Some(LeaderChange {
            kind: "vacant".into(),
            leader: None,
            previous_term: Some(BigInt::from(previous_term.get())),
            expired: Some(expired),
        }),
        // A kind of change this binding does not know yet ends the
        // observation rather than being misreported.
        Some(_) => None,
    })
}

/// Options of `resume`.
#[napi(object)]
pub struct ResumeOptions {
    /// Lease length from now on (default: the client's).
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// Renewal period (default: a third of the TTL).
    #[napi(ts_type = "number | string")]
    pub renew_every: Option<JsDuration>,
}

/// A change of a key's holder.
#[napi(object)]
pub struct KeyChange {
    /// `'acquired'`, `'released'` (or force-released) or `'expired'`.
    pub kind: String,
    /// The key.
    pub key: String,
    /// The holder whose lease began or ended.
    pub owner: String,
    /// That lease's fencing token.
    pub token: BigInt,
    /// The new lease as the backend reports it (`'acquired'`).
    pub lease: Option<LockInfo>,
}

impl KeyChange {
    /// `None` for a kind of change this binding does not know yet: the
    /// watch ends rather than misreport it.
    fn new(change: HolderChange) -> Option<Self> {
        let (kind, id, lease) = match change {
            HolderChange::Acquired(info) => {
                let id = fencelock::LeaseId::new(info.key.clone(), info.owner.clone(), info.token);
                ("acquired", id, Some(LockInfo::from(info)))
            }
            HolderChange::Released(id) => ("released", id, None),
            HolderChange::Expired(id) => ("expired", id, None),
            _ => return None,
        };
        Some(KeyChange {
            kind: kind.into(),
            key: id.key.as_str().to_owned(),
            owner: id.owner.as_str().to_owned(),
            token: BigInt::from(id.token.get()),
            lease,
        })
    }
}

/// The holder changes of a key (native half of `watch`).
#[napi]
pub struct KeyWatch {
    watch: Arc<tokio::sync::Mutex<fencelock::Watch>>,
    closed: CancellationToken,
}

#[napi]
impl KeyWatch {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi]
    pub fn next(&self, env: Env, id: f64) -> Result<()> {
        let (watch, closed) = (self.watch.clone(), self.closed.clone());
        start(&env, id, async move {
            let mut watch = watch.lock().await;
            let change = tokio::select! {
                change = watch.next() => change,
                () = closed.cancelled() => None,
            };
            Ok(change
                .transpose()
                .map_err(js_error)?
                .and_then(KeyChange::new))
        })
    }

    /// Stops watching: a pending and every later `next` give `null`.
    #[napi]
    pub fn close(&self) {
        self.closed.cancel();
    }
}

/// A fence: admits a resource's writes only with the highest token seen.
#[napi]
pub struct Fence {
    inner: Arc<dyn fencelock::Fence>,
}

#[napi]
impl Fence {
    /// Admits `token` for `resource` (exclusive holders); rejects a stale one.
    #[napi]
    pub fn admit(&self, env: Env, id: f64, resource: String, token: BigInt) -> Result<()> {
        let (fence, token) = (self.inner.clone(), token_from_js(token)?);
        start(&env, id, async move {
            fence.admit(&resource, token).await.map_err(js_error)
        })
    }

    /// Admits `token` of a reader of a read-write lock.
    #[napi]
    pub fn admit_shared(&self, env: Env, id: f64, resource: String, token: BigInt) -> Result<()> {
        let (fence, token) = (self.inner.clone(), token_from_js(token)?);
        start(&env, id, async move {
            fence
                .admit_shared(&resource, token, LockMode::Shared)
                .await
                .map_err(js_error)
        })
    }
}
