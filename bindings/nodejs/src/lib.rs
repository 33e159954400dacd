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
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use fencelock::{
    CancellationToken, FencingToken, GuardHandle, HolderChange, Leadership, LockGuard, LockMode,
    Owner,
};
use napi::bindgen_prelude::{BigInt, Either, Env, Object};
use napi_derive::napi;
use tokio::runtime::Handle;

type Result<T> = napi::Result<T>;

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
    let message = format!(
        "{what} {:?} is not a duration (milliseconds, or e.g. '30s')",
        fencelock::shorten(value)
    );
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
pub async fn connect(url: String, options: Option<ConnectOptions>) -> Result<Client> {
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
        runtime: Handle::try_current().ok(),
    })
}

/// Blocks the JavaScript thread until the releases that collected guards
/// sent in the background are done, at most `bound_ms`; `true` when none
/// is left. `index.js` runs it in the `'exit'` event after closing the
/// clients still open, so that a guard collected just before the exit is
/// released too.
#[napi]
pub fn wait_for_background_releases(bound_ms: f64) -> Result<bool> {
    let bound = duration(&Either::A(bound_ms), "bound", false)?;
    Ok(napi::bindgen_prelude::block_on(
        fencelock::wait_for_background_releases(bound),
    ))
}

/// Opens the fence kept by the backend a URL names.
#[napi]
pub async fn open_fence(url: String) -> Result<Fence> {
    Ok(Fence {
        inner: fencelock::open_fence(&url).await.map_err(js_error)?,
    })
}

/// A lock client (native half).
#[napi]
pub struct Client {
    inner: fencelock::LockClient,
    /// The binding's runtime, where the exit hook's `close` runs.
    runtime: Option<Handle>,
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

#[napi]
impl Client {
    /// The owner name this client's locks are taken as.
    #[napi(getter)]
    pub fn owner(&self) -> String {
        self.inner.owner().as_str().to_owned()
    }

    /// Acquires `key` (exclusive).
    #[napi]
    pub async fn acquire(&self, key: String, options: Option<LockOptions>) -> Result<Guard> {
        let client = self.inner.clone();
        let guard = request(client.lock(key), options)?
            .acquire()
            .await
            .map_err(js_error)?;
        Ok(Guard::new(guard, None))
    }

    /// Acquires the read-write lock `key` as a reader (`shared`) or writer.
    #[napi]
    pub async fn acquire_rw(
        &self,
        key: String,
        shared: bool,
        options: Option<LockOptions>,
    ) -> Result<Guard> {
        let client = self.inner.clone();
        let rw = client.rwlock(key);
        let base = if shared { rw.read() } else { rw.write() };
        let guard = request(base, options)?.acquire().await.map_err(js_error)?;
        Ok(Guard::new(guard, None))
    }

    /// Takes one of the `permits` permits of the semaphore `name`.
    #[napi]
    pub async fn acquire_permit(
        &self,
        name: String,
        permits: u32,
        options: Option<LockOptions>,
    ) -> Result<Guard> {
        let client = self.inner.clone();
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

    /// Acquires every key of `keys`, all or none.
    #[napi]
    pub async fn lock_all(
        &self,
        keys: Vec<String>,
        options: Option<LockOptions>,
    ) -> Result<MultiGuard> {
        let client = self.inner.clone();
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

    /// The current lease of `key`, if any.
    #[napi]
    pub async fn inspect(&self, key: String) -> Result<Option<LockInfo>> {
        let info = self.inner.inspect(&key).await.map_err(js_error)?;
        Ok(info.map(LockInfo::from))
    }

    /// Every current lease (whose key starts with `prefix`).
    #[napi]
    pub async fn list(&self, prefix: Option<String>) -> Result<Vec<LockInfo>> {
        let leases = self.inner.list(prefix.as_deref()).await.map_err(js_error)?;
        Ok(leases.into_iter().map(LockInfo::from).collect())
    }

    /// Counts of the backend's leases.
    #[napi]
    pub async fn stats(&self) -> Result<Stats> {
        let s = self.inner.stats().await.map_err(js_error)?;
        Ok(Stats {
            held: s.held as f64,
            held_by_kind: counts(s.held_by_kind),
            held_by_owner: counts(s.held_by_owner),
            avg_hold_seconds: s.avg_hold_seconds,
            max_hold_seconds: s.max_hold_seconds,
            expired_not_cleaned: s.expired_not_cleaned as f64,
        })
    }

    /// Ends the lease of `key` whoever holds it; the lease it ended, if any.
    #[napi]
    pub async fn force_release(&self, key: String) -> Result<Option<LockInfo>> {
        let info = self.inner.force_release(&key).await.map_err(js_error)?;
        Ok(info.map(LockInfo::from))
    }

    /// Deletes expired leases; how many.
    #[napi]
    pub async fn cleanup(&self) -> Result<f64> {
        Ok(self.inner.cleanup().await.map_err(js_error)? as f64)
    }

    /// Re-attaches to the lease of `owner` on `key` granted with `token`
    /// (one a guard detached, here or in another process): a guard renewed
    /// by this client, once the backend confirmed the lease is current.
    #[napi]
    pub async fn resume(
        &self,
        key: String,
        owner: String,
        token: BigInt,
        options: Option<ResumeOptions>,
    ) -> Result<Guard> {
        let owner = Owner::new(owner).map_err(js_error)?;
        let mut request = self.inner.resume(key, owner, token_from_js(token)?);
        if let Some(o) = options {
            if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
                request = request.ttl(ttl);
            }
            if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
                request = request.renew_every(period);
            }
        }
        Ok(Guard::new(request.await.map_err(js_error)?, None))
    }

    /// The holder changes of `key` from now on.
    #[napi]
    pub async fn watch(&self, key: String) -> Result<KeyWatch> {
        let watch = self.inner.watch(&key).await.map_err(js_error)?;
        Ok(KeyWatch {
            watch: tokio::sync::Mutex::new(watch),
            closed: CancellationToken::new(),
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
    pub async fn close(&self) -> Result<()> {
        self.inner.close().await.map_err(js_error)
    }

    /// `close()`, blocking the JavaScript thread until done (each release
    /// bounded by the operation timeout): what `index.js` runs for every
    /// client still open when Node.js exits normally (its `'exit'` event:
    /// the event loop ran out of work, or `process.exit()`), when no
    /// Promise can settle any more. Python's interpreter releases a
    /// process's locks at exit alike. A crash or a kill releases nothing.
    #[napi]
    pub fn close_blocking(&self) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        if let Err(e) = runtime.block_on(self.inner.close()) {
            eprintln!("fencelock: releasing the locks held at exit: {e}");
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

/// A held lock (native half): renewed in the background until released,
/// lost or collected.
#[napi]
pub struct Guard {
    /// An async mutex: `proclaim` uses the leadership across an await, and
    /// a `release` meanwhile must wait for it rather than find nothing.
    guard: tokio::sync::Mutex<Option<Holding>>,
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
            guard: tokio::sync::Mutex::new(Some(holding)),
            slot,
            runtime: Handle::try_current().ok(),
            done: CancellationToken::new(),
        }
    }
}

/// Dropped by the garbage collector (the JavaScript object became
/// unreachable without `release()`): stops renewing and releases the lease
/// in the background, on the binding's runtime.
impl Drop for Guard {
    fn drop(&mut self) {
        self.done.cancel();
        drop_on(self.runtime.as_ref(), self.guard.get_mut().take());
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

/// Settles with the loss reason, or with `null` once `done` is cancelled.
fn wait_lost(
    env: Env,
    lost: impl std::future::Future<Output = String> + Send + 'static,
    done: CancellationToken,
) -> Result<Object> {
    env.spawn_future(async move {
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
    pub async fn renew(&self) -> Result<()> {
        self.handle.renew().await.map_err(js_error)
    }

    /// Settles with the loss reason; with `null` once released.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn wait_lost(&self, env: Env) -> Result<Object> {
        let lost = self.handle.lost();
        wait_lost(
            env,
            async move { lost.await.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Stops renewal and releases the lease; a second call does nothing.
    #[napi]
    pub async fn release(&self) -> Result<()> {
        let guard = self.guard.lock().await.take();
        self.done.cancel();
        match guard {
            Some(guard) => guard.release().await.map_err(js_error),
            None => Ok(()),
        }
    }

    /// Stops renewing and leaves the lease to expire, or to `resume` by
    /// key, owner and token (in this process or another).
    #[napi]
    pub async fn detach(&self) {
        let guard = self.guard.lock().await.take();
        self.done.cancel();
        if let Some(guard) = guard {
            guard.detach();
        }
    }

    /// Publishes `value` as the leader's value (a leadership only).
    #[napi]
    pub async fn proclaim(&self, value: serde_json::Value) -> Result<()> {
        match self.guard.lock().await.as_ref() {
            Some(Holding::Leader(leadership)) => leadership.proclaim(value).await.map_err(js_error),
            Some(Holding::Lock(_)) => Err(js_error(fencelock::Error::InvalidArgument(
                "only an election's leadership can proclaim".into(),
            ))),
            None => Err(js_error(fencelock::Error::not_held(self.handle.lease()))),
        }
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

    /// Settles with the first loss reason; with `null` once released.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn wait_lost(&self, env: Env) -> Result<Object> {
        let Some(lost) = lock(&self.guard).as_ref().map(|g| g.lost()) else {
            return env.spawn_future(async { Ok(None::<String>) });
        };
        wait_lost(
            env,
            async move { lost.await.1.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Releases every lease.
    #[napi]
    pub async fn release(&self) -> Result<()> {
        let guard = lock(&self.guard).take();
        self.done.cancel();
        match guard {
            Some(guard) => guard.release().await.map_err(js_error),
            None => Ok(()),
        }
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
    pub async fn campaign(&self) -> Result<Guard> {
        let leadership = self.inner.campaign().await.map_err(js_error)?;
        Ok(Guard::holding(
            leadership.handle(),
            Holding::Leader(leadership),
            None,
        ))
    }

    /// The current leader, if any.
    #[napi]
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let leader = self.inner.leader().await.map_err(js_error)?;
        Ok(leader.map(Leader::from))
    }

    /// The current leader (first) and every change from now on.
    #[napi]
    pub async fn observe(&self) -> Result<LeaderObserver> {
        let watch = self.inner.observe().await.map_err(js_error)?;
        Ok(LeaderObserver {
            watch: tokio::sync::Mutex::new(watch),
            closed: CancellationToken::new(),
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
    watch: tokio::sync::Mutex<fencelock::LeaderWatch>,
    closed: CancellationToken,
}

#[napi]
impl LeaderObserver {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi]
    pub async fn next(&self) -> Result<Option<LeaderChange>> {
        let mut watch = self.watch.lock().await;
        let change = tokio::select! {
            change = watch.next() => change,
            () = self.closed.cancelled() => None,
        };
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

    /// Stops observing: a pending and every later `next` give `null`.
    #[napi]
    pub fn close(&self) {
        self.closed.cancel();
    }
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
    watch: tokio::sync::Mutex<fencelock::Watch>,
    closed: CancellationToken,
}

#[napi]
impl KeyWatch {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi]
    pub async fn next(&self) -> Result<Option<KeyChange>> {
        let mut watch = self.watch.lock().await;
        let change = tokio::select! {
            change = watch.next() => change,
            () = self.closed.cancelled() => None,
        };
        Ok(change
            .transpose()
            .map_err(js_error)?
            .and_then(KeyChange::new))
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
    pub async fn admit(&self, resource: String, token: BigInt) -> Result<()> {
        let token = token_from_js(token)?;
        self.inner.admit(&resource, token).await.map_err(js_error)
    }

    /// Admits `token` of a reader of a read-write lock.
    #[napi]
    pub async fn admit_shared(&self, resource: String, token: BigInt) -> Result<()> {
        let token = token_from_js(token)?;
        self.inner
            .admit_shared(&resource, token, LockMode::Shared)
            .await
            .map_err(js_error)
    }

    /// Forgets `resource` (`Fence::reset`): its highest tokens and its
    /// stored value; the highest token it had, or `null`.
    #[napi]
    pub async fn reset(&self, resource: String) -> Result<Option<BigInt>> {
        let had = self.inner.reset(&resource).await.map_err(js_error)?;
        Ok(had.map(|token| BigInt::from(token.get())))
    }
}
