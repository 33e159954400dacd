//! `LockClient`: acquisition, waiting, and the operator calls.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::time::Instant;
use tracing::Instrument;

use crate::{
    backend::{Acquire, AcquireRequest, Backend, Grant, Stats},
    backoff::Backoff,
    clock::{ClockPolicy, Sent},
    deadline::bounded,
    error::{Error, ErrorStatus, Result},
    guard::{GuardHandle, LockGuard},
    lease::GuardConfig,
    metrics as m,
    renewer::Renewer,
    types::{validate_ttl, FencingToken, LockInfo, LockKey, LockMode, Owner},
    watch::Watch,
};

/// Default lease length when neither the request nor the client sets one
/// (the same 30 s as Redisson's watchdog).
const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default bound on one backend call made outside a wait deadline.
const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `kind` label.
const MAX_KIND_LEN: usize = 64;
/// Releases `close` keeps in flight: enough to hide round trips, few enough
/// that none waits behind the others for a connection past its timeout.
const CLOSE_CONCURRENCY: usize = 32;
/// Largest `data` payload, serialized.
const MAX_DATA_LEN: usize = 64 * 1024;
/// Longest stretch a waiting attempt waits where the key is
/// ([`crate::Capabilities::waits`]): well under the minute after which
/// proxies and load balancers drop a quiet request.
const WAIT_THERE_MAX: Duration = Duration::from_secs(20);
/// Backoff while waiting without wake-ups (or between them): starts at 1 ms,
/// caps at 1 s. A short first step makes a hand-off on an engine without
/// wake-ups (MariaDB) cost a millisecond or two rather than a 5 ms step, for
/// two or three more polls per wait.
pub(crate) const WAIT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(1));

/// Builds a [`LockClient`] with non-default settings.
#[derive(Debug)]
pub struct LockClientBuilder {
    backend: Arc<dyn Backend>,
    owner: Option<Owner>,
    ttl: Duration,
    clock: ClockPolicy,
    op_timeout: Duration,
    watch_interval: Duration,
}

impl LockClientBuilder {
    /// The owner every lock of this client is taken as (default:
    /// [`Owner::generate`]).
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Default lease length (default 30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How conservatively guards trust their leases.
    pub fn clock_policy(mut self, clock: ClockPolicy) -> Self {
        self.clock = clock;
        self
    }

    /// Bound on one backend call that no wait deadline bounds (default 10 s).
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How often [`LockClient::watch`] inspects the key on backends without
    /// a native holder-change stream (default 200 ms): the latency of such a
    /// watch is up to this plus one round trip.
    pub fn watch_interval(mut self, interval: Duration) -> Self {
        self.watch_interval = interval;
        self
    }

    /// Validates the settings. The first client built in a process also
    /// describes the metrics to the installed recorder ([`m::describe`]).
    pub fn build(self) -> Result<LockClient> {
        validate_ttl(self.ttl)?;
        m::describe_once();
        if self.op_timeout.is_zero() {
            return Err(Error::InvalidArgument("op_timeout must be positive".into()));
        }
        if self.watch_interval.is_zero() {
            return Err(Error::InvalidArgument(
                "watch_interval must be positive".into(),
            ));
        }
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                backend: self.backend,
                owner: self.owner.unwrap_or_else(Owner::generate),
                ttl: self.ttl,
                clock: self.clock,
                op_timeout: self.op_timeout,
                watch_interval: self.watch_interval,
                renewer: Renewer::default(),
            }),
        })
    }
}

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn Backend>,
    owner: Owner,
    ttl: Duration,
    clock: ClockPolicy,
    pub(crate) op_timeout: Duration,
    watch_interval: Duration,
    /// Renews every lease this client (and its clones) holds.
    pub(crate) renewer: Renewer,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.renewer.client_dropped();
    }
}

impl std::fmt::Debug for ClientInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend)
            .field("owner", &self.owner)
            .field("ttl", &self.ttl)
            .field("clock", &self.clock)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

/// Takes locks on one backend as one owner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

impl LockClient {
    /// A client with a generated owner and default settings.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::builder(backend)
            .build()
            .expect("the default settings are valid")
    }

    /// A client with settings of your choice.
    pub fn builder(backend: Arc<dyn Backend>) -> LockClientBuilder {
        LockClientBuilder {
            backend,
            owner: None,
            ttl: DEFAULT_TTL,
            clock: ClockPolicy::default(),
            op_timeout: DEFAULT_OP_TIMEOUT,
            watch_interval: crate::poll::DEFAULT_POLL_INTERVAL,
        }
    }

    /// The owner this client's locks are taken as.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Starts building an acquisition of `key`.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest {
            client: self,
            key: key.into(),
            owner: None,
            ttl: None,
            wait: Duration::ZERO,
            kind: None,
            data: None,
            min_token: None,
            renew_every: None,
            auto_renew: true,
            mode: LockMode::Exclusive,
            hold_at_least: None,
            queued: false,
        }
    }

    /// The read-write lock on `key` (see [`RwLock`]).
    pub fn rwlock(&self, key: impl Into<String>) -> RwLock<'_> {
        RwLock {
            client: self,
            key: key.into(),
        }
    }

    /// Every unexpired lease on exactly `key`: its writer, or its readers
    /// (by token), or nothing.
    pub async fn holders(&self, key: &str) -> Result<Vec<LockInfo>> {
        let key = LockKey::new(key)?;
        let mut found = self
            .inner
            .backend
            .administer()?
            .list(Some(key.as_str()))
            .await?;
        found.retain(|lease| lease.key == key);
        Ok(found)
    }

    /// One attempt with default settings: `Ok(None)` when someone else holds
    /// `key`.
    pub async fn try_lock(&self, key: impl Into<String>) -> Result<Option<LockGuard>> {
        self.lock(key).try_acquire().await
    }

    /// Runs `f` while holding `key` (default settings, no waiting). When the
    /// lock is lost, `f`'s future is dropped at its next await point and the
    /// result is [`Error::LockLost`]. See [`LockRequest::run`].
    pub async fn with_lock<F, Fut, T>(&self, key: impl Into<String>, f: F) -> Result<T>
    where
        F: FnOnce(GuardHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(key).run(f).await
    }

    /// The current lease on `key`, if any.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>> {
        self.inner.backend.inspect(&LockKey::new(key)?).await
    }

    /// Current leases whose key starts with `prefix`. This and the other
    /// operator's calls below answer [`Error::Unsupported`] on a backend
    /// without [`crate::Backend::admin`].
    pub async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.inner.backend.administer()?.list(prefix).await
    }

    /// Operator statistics.
    pub async fn stats(&self) -> Result<Stats> {
        self.inner.backend.administer()?.stats().await
    }

    /// Deletes expired lease records.
    pub async fn cleanup(&self) -> Result<u64> {
        self.inner.backend.administer()?.cleanup_expired().await
    }

    /// Removes whatever lease `key` has, whoever holds it.
    pub async fn force_release(&self, key: &str) -> Result<Option<LockInfo>> {
        self.inner
            .backend
            .administer()?
            .force_release(&LockKey::new(key)?)
            .await
    }

    /// Releases every lease held by `owner`.
    pub async fn release_all(&self, owner: &Owner) -> Result<u64> {
        self.inner.backend.administer()?.release_all(owner).await
    }

    /// The holder changes of `key` from now on (acquisitions, releases and
    /// expiries). Backends that claim [`crate::Capabilities::watch`] stream
    /// them natively; on the others the client inspects the key every
    /// [`LockClientBuilder::watch_interval`] and reports the differences,
    /// in a task that ends when the [`Watch`] is dropped (a lease that
    /// begins and ends between two polls is then not seen).
    pub async fn watch(&self, key: &str) -> Result<Watch> {
        let key = LockKey::new(key)?;
        let backend = &self.inner.backend;
        if backend.capabilities().watch {
            return backend.watch(&key).await;
        }
        crate::poll::poll_watch(
            Arc::clone(backend),
            key,
            self.inner.watch_interval,
            self.inner.op_timeout,
        )
        .await
    }

    /// The holder of `key` as read now, and a watch of every change after
    /// that read, for an observer that reports the read first. With the
    /// backend's own watch: the watch first, then the read (a change
    /// between the two is in both; the observer skips what the read
    /// already showed). Polled: the read is the polls' baseline.
    pub(crate) async fn read_and_watch(&self, key: &LockKey) -> Result<(Option<LockInfo>, Watch)> {
        let backend = &self.inner.backend;
        if backend.capabilities().watch {
            let changes = backend.watch(key).await?;
            let current = backend.inspect(key).await?;
            return Ok((current, changes));
        }
        crate::poll::read_and_poll(
            Arc::clone(backend),
            key.clone(),
            self.inner.watch_interval,
            self.inner.op_timeout,
        )
        .await
    }

    /// The client's operation timeout.
    pub(crate) fn op_timeout(&self) -> Duration {
        self.inner.op_timeout
    }

    /// Releases every lock this client (or any clone of it) holds, and
    /// refuses new acquisitions with [`Error::ClientClosed`].
    ///
    /// Each guard still in use reports the loss with
    /// [`crate::LossReason::Closed`] at once (so `run` closures are
    /// cancelled), and its own `release` then answers `Ok`. The leases are
    /// then freed, at most 32 at a time (a pool of a few connections queues
    /// the rest, and a queued release would spend its timeout waiting), each
    /// bounded by the operation timeout from its own start; the first
    /// failure is returned after all have been tried (a lease whose release
    /// failed ends by expiry).
    pub async fn close(&self) -> Result<()> {
        use futures_util::StreamExt as _;
        let mut to_free = self.inner.renewer.close();
        to_free.retain(|shared| shared.close());
        let results: Vec<Result<()>> = futures_util::stream::iter(to_free)
            .map(|shared| shared.free_closed())
            .buffer_unordered(CLOSE_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

/// An acquisition being built: `client.lock("key").ttl(..).wait(..).acquire()`.
///
/// Semaphores and multi-key locks keep one as the template of the leases
/// they take, so the options are declared and checked in one place.
#[derive(Clone, Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest<'a> {
    pub(crate) client: &'a LockClient,
    key: String,
    owner: Option<Owner>,
    ttl: Option<Duration>,
    pub(crate) wait: Duration,
    kind: Option<String>,
    pub(crate) data: Option<serde_json::Value>,
    min_token: Option<FencingToken>,
    renew_every: Option<Duration>,
    auto_renew: bool,
    mode: LockMode,
    hold_at_least: Option<Duration>,
    queued: bool,
}

impl LockRequest<'_> {
    /// The same options for another key.
    pub(crate) fn for_key(&self, key: String) -> Self {
        Self {
            key,
            ..self.clone()
        }
    }

    /// Lease length; renewal extends it by this much each time.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for a held lock (default: not at all).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Take this lock as `owner` instead of the client's owner.
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// A label stored with the lease (`workflow`, `node`, `resource`, …).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// JSON metadata stored with the lease (at most 64 KiB serialized).
    pub fn data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    /// A floor for the grant's token: it will be greater than `floor` (as
    /// well as greater than every token issued for the key before). Needs a
    /// backend that claims [`crate::Capabilities::min_token`];
    /// [`Error::Unsupported`] elsewhere, never a silently lower token.
    pub fn min_token(mut self, floor: FencingToken) -> Self {
        self.min_token = Some(floor);
        self
    }

    /// Renewal period (default: a third of the TTL). Must be shorter than the
    /// time the guard trusts a lease ([`ClockPolicy::valid_for`]).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.renew_every = Some(period);
        self
    }

    /// Lock delay (`docs/lock-delay.md`): the key stays unavailable to
    /// others for at least `delay` from the grant, however early the guard
    /// is released, dropped or lost. A release before then shortens the
    /// lease to what is left of `delay` (a renewal, on the backend's clock)
    /// instead of deleting it, and the lease granted (at least the TTL) and
    /// every renewal already cover `delay` if the holder dies. Must be
    /// positive and no longer than the TTL ([`Error::InvalidArgument`]);
    /// exclusive locks only.
    pub fn hold_at_least(mut self, delay: Duration) -> Self {
        self.hold_at_least = Some(delay);
        self
    }

    /// Marks a single try as one attempt of a wait that the caller runs
    /// itself across requests (a lock service's client does,
    /// `docs/fairness.md`): on a backend that claims
    /// [`crate::Capabilities::fair`], a refused try leaves or refreshes the
    /// owner's queue entry on the key, and the caller withdraws it with
    /// [`crate::FairQueue::leave_queue`] when its wait ends without a grant. Ignored
    /// for a request that waits here (it keeps its own entry) and on other
    /// backends.
    pub fn queued(mut self, yes: bool) -> Self {
        self.queued = yes;
        self
    }

    /// Whether the guard renews in the background (default `true`). Without
    /// renewal the guard still signals loss at its local deadline.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    pub(crate) fn validate(&self) -> Result<(AcquireRequest, GuardConfig)> {
        let inner = &self.client.inner;
        let key = LockKey::new(self.key.as_str())?;
        let ttl = validate_ttl(self.ttl.unwrap_or(inner.ttl))?;
        if let Some(kind) = &self.kind {
            if kind.is_empty() || kind.len() > MAX_KIND_LEN || kind.chars().any(char::is_control) {
                return Err(Error::InvalidArgument(format!(
                    "kind must be 1–{MAX_KIND_LEN} bytes without control characters"
                )));
            }
        }
        if let Some(data) = &self.data {
            validate_data(data)?;
        }
        let trusted = inner.clock.valid_for(ttl);
        let renew_every = match (self.auto_renew, self.renew_every) {
            (false, _) => None,
            (true, None) => Some(ttl / 3),
            (true, Some(p)) if p.is_zero() || p >= trusted => {
                return Err(Error::InvalidArgument(format!(
                    "renew_every {p:?} must be positive and shorter than {trusted:?}, \
                     the time a {ttl:?} lease is trusted locally"
                )))
            }
            (true, Some(p)) => Some(p),
        };
        if let Some(floor) = self.min_token {
            if !inner.backend.capabilities().min_token {
                return Err(Error::unsupported(inner.backend.name(), "min_token"));
            }
            FencingToken::check_floor(floor)?;
        }
        if self.mode == LockMode::Shared && !inner.backend.capabilities().shared {
            return Err(Error::unsupported(inner.backend.name(), "shared locks"));
        }
        if let Some(delay) = self.hold_at_least {
            if delay.is_zero() || delay > ttl {
                return Err(Error::InvalidArgument(format!(
                    "hold_at_least {delay:?} must be positive and no longer than the {ttl:?} TTL"
                )));
            }
            if self.mode == LockMode::Shared {
                return Err(Error::InvalidArgument(
                    "hold_at_least applies to exclusive locks, not readers".into(),
                ));
            }
        }
        let owner = self.owner.clone().unwrap_or_else(|| inner.owner.clone());
        let request = AcquireRequest::new(key, owner, ttl)
            .with_kind(self.kind.clone())
            .with_data(self.data.clone())
            .with_min_token(self.min_token)
            .with_mode(self.mode);
        let config = GuardConfig {
            renew_every,
            clock: inner.clock,
            op_timeout: inner.op_timeout,
            hold_at_least: self.hold_at_least,
        };
        Ok((request, config))
    }

    /// Acquires the lock, waiting up to [`wait`](Self::wait) for it.
    ///
    /// While waiting, the client uses the backend's release wake-ups when it
    /// has them and otherwise backs off with full jitter (1 ms doubling to
    /// 1 s), never sleeping past the current holder's expiry or the deadline.
    /// Returns [`Error::Timeout`] when the deadline passes.
    ///
    /// On a backend that claims [`crate::Capabilities::fair`], waiters of
    /// the exclusive side are granted in the order they started waiting:
    /// the wait keeps a queue entry (a lease of the request's TTL,
    /// refreshed by every attempt) and withdraws it when it ends without a
    /// grant or is dropped (`docs/fairness.md`).
    ///
    /// A guard is never born lost: a grant whose answer arrives after the
    /// guard would already have stopped trusting it (a round trip longer
    /// than the lease, I5) is released and counted as a failed attempt. If
    /// the deadline passes that way, the error is a transient one saying so.
    pub async fn acquire(self) -> Result<LockGuard> {
        if self.client.inner.renewer.is_closed() {
            return Err(Error::ClientClosed);
        }
        let (request, config) = self.validate()?;
        let span = tracing::debug_span!(
            "fencelock.acquire",
            key = %request.key,
            owner = %request.owner,
            mode = %request.mode,
            backend = self.client.inner.backend.name(),
        );
        acquire_loop(&self.client.inner, request, config, self.wait, self.queued)
            .instrument(span)
            .await
    }

    /// One attempt, no waiting: `Ok(None)` when someone else holds the key.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Acquires the lock, runs `f` with a handle to the guard, and releases.
    ///
    /// If the lock is lost while `f` runs, `f`'s future is dropped (cancelled
    /// at its next await point) and the result is [`Error::LockLost`]. When `f`
    /// finishes while the lock is still valid, its value is returned even if
    /// the release that follows fails (the failure is logged; the lease then
    /// ends by expiry).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use fencelock_core::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let client = LockClient::new(Arc::new(MemoryBackend::new()));
    /// let token = client
    ///     .lock("nightly-report")
    ///     .run(|guard| async move { guard.token() })
    ///     .await?;
    /// assert!(token.get() > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T>
    where
        F: FnOnce(GuardHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        let work = f(guard.handle());
        tokio::pin!(work);
        tokio::select! {
            biased;
            reason = guard.lost() => Err(Error::LockLost {
                key: guard.key().clone(),
                token: guard.token(),
                reason,
            }),
            value = &mut work => {
                guard.check()?;
                if let Err(e) = guard.release().await {
                    tracing::warn!(error = %e, "release after with_lock failed; the lease will expire");
                }
                Ok(value)
            }
        }
    }
}

async fn acquire_loop(
    client: &ClientInner,
    request: AcquireRequest,
    config: GuardConfig,
    wait: Duration,
    queued: bool,
) -> Result<LockGuard> {
    let backend = &client.backend;
    let name = backend.name();
    let started = Instant::now();
    // `None`: a wait too long to represent (e.g. `Duration::MAX`) is forever.
    let deadline = started.checked_add(wait);
    let before_deadline = |now: Instant| deadline.is_none_or(|d| now < d);
    let queue = QueueEntry::new(client, &request, wait);
    // A backend that waits where the key is (a lock service) is asked to,
    // one stretch at a time: it is woken there by its own backend, so the
    // wait needs no subscription here. Queued waits keep the attempts that
    // refresh their entry.
    let waits_there = backend.capabilities().waits
        && !wait.is_zero()
        && request.mode == LockMode::Exclusive
        && queue.is_none();
    // Subscribe before the first try so that a release between a failed try
    // and the wait that follows is still seen. Bounded like every other
    // call, and by the wait itself: an unanswered subscription must not
    // stretch the wait, it only costs the wake-ups.
    let mut wakeups = if wait.is_zero() || !backend.capabilities().wakeups || waits_there {
        None
    } else {
        let subscribe = backend.subscribe(&request.key);
        match tokio::time::timeout(client.op_timeout.min(wait), subscribe).await {
            Ok(Ok(sub)) => sub,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "no wake-ups; waiting with backoff");
                None
            }
            Err(_) => {
                tracing::debug!("subscribing to wake-ups did not answer; waiting with backoff");
                None
            }
        }
    };
    let mut backoff = Backoff::new(WAIT_BACKOFF.0, WAIT_BACKOFF.1);
    let mut intent = WriteIntent::new(client, &request, wait);
    let mut queue = queue;
    // One try of a wait run across requests keeps the caller's entry.
    let queued = queued
        && wait.is_zero()
        && request.mode == LockMode::Exclusive
        && backend.capabilities().fair;
    let request = request.with_queue(queue.is_some() || queued);
    loop {
        let stretch = if waits_there {
            // The lease is counted from before the call, so a grant at the
            // end of a stretch must leave most of it trusted.
            let left = deadline.map_or(WAIT_THERE_MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            left.min(WAIT_THERE_MAX).min(request.ttl / 3)
        } else {
            Duration::ZERO
        };
        let asked = Instant::now();
        let outcome = attempt(client, &request, config, deadline, started, stretch).await;
        // Held after waiting its whole stretch where the key is: ask again
        // at once (a backend that answered early is waited for here).
        let waited = !stretch.is_zero() && asked.elapsed() >= stretch;
        let retry = matches!(outcome, Ok(Attempt::Retry));
        let holder = match outcome {
            Ok(Attempt::Granted(guard)) => {
                // The grant took the entry off the queue on the backend.
                if let Some(entry) = queue.as_mut() {
                    entry.granted();
                }
                return Ok(guard);
            }
            Ok(Attempt::Held(holder)) => holder,
            Ok(Attempt::Retry) => None,
            Err(e) => {
                intent.withdraw(client, &request).await;
                if let Some(entry) = queue.take() {
                    entry.leave().await;
                }
                return Err(e);
            }
        };
        if let Some(reader) = holder.as_ref().filter(|h| h.mode == LockMode::Shared) {
            intent.post(client, &request, reader).await;
        }
        let now = Instant::now();
        if !before_deadline(now) {
            intent.withdraw(client, &request).await;
            if let Some(entry) = queue.take() {
                entry.leave().await;
            }
            // A single try that found the key held is not a timeout.
            if !wait.is_zero() {
                ::metrics::counter!(m::ACQUIRE_TIMEOUTS, "backend" => name).increment(1);
            }
            return Err(Error::Timeout {
                key: request.key,
                waited: wait,
            });
        }
        if waited {
            continue;
        }
        // A complete source signals every release: a try of its own would
        // only delay the answer to one (after a failed try, back off).
        let mut pause = match &wakeups {
            Some(sub) if sub.is_complete() && !retry => WAIT_BACKOFF.1,
            _ => backoff.next_pause(),
        };
        if let Some(deadline) = deadline {
            pause = pause.min(deadline - now);
        }
        if let Some(holder) = holder {
            // The holder's lease ends on its own: no point sleeping past that.
            pause = pause.min(holder.expires_in + Duration::from_millis(1));
        }
        if let Some(refresh) = intent.refresh_every() {
            pause = pause.min(refresh);
        }
        if let Some(entry) = &queue {
            pause = pause.min(entry.refresh_every());
        }
        match wakeups.as_mut() {
            Some(sub) => {
                tokio::select! {
                    alive = sub.woken() => if !alive {
                        tracing::debug!("wake-up source ended; waiting with backoff");
                        wakeups = None;
                    } else {
                        backoff.reset();
                    },
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// The outcome of one [`attempt`].
pub(crate) enum Attempt {
    /// Granted: the guard is live and registered with the renewer.
    Granted(LockGuard),
    /// Someone else holds the key (and who, where the backend says).
    Held(Option<LockInfo>),
    /// No grant this time (a transient error, a late grant given back, no
    /// answer) but the deadline has not passed: try again.
    Retry,
}

/// One try at `request` within a wait that ends at `deadline` (`None`:
/// never), for `acquire_loop` and for callers that choose among keys
/// themselves (semaphores). Failures past the deadline, and permanent ones,
/// are errors.
pub(crate) async fn attempt(
    client: &ClientInner,
    request: &AcquireRequest,
    config: GuardConfig,
    deadline: Option<Instant>,
    started: Instant,
    stretch: Duration,
) -> Result<Attempt> {
    let backend = &client.backend;
    let name = backend.name();
    let before_deadline = |now: Instant| deadline.is_none_or(|d| now < d);
    ::metrics::counter!(m::ACQUIRE_ATTEMPTS, "backend" => name).increment(1);
    let sent = Sent::now();
    let call = async {
        if stretch.is_zero() {
            backend.try_acquire(request).await
        } else {
            backend.try_acquire_waiting(request, stretch).await
        }
    };
    let attempt = tokio::time::timeout(client.op_timeout + stretch, call).await;
    match attempt {
        Ok(Ok(Acquire::Granted(grant)))
            if Instant::now() >= sent.mono + config.clock.valid_for(grant.ttl) =>
        {
            // The answer took longer than the lease is trusted (I5), so
            // the lease may already have ended on the backend: a guard
            // for it would be lost at birth. Hand it back rather than
            // make the next holder wait out its TTL, and count the
            // attempt as failed.
            give_back_late_grant(client, request, &grant, sent).await;
            if !before_deadline(Instant::now()) {
                return Err(crate::BackendError::message(
                    name,
                    ErrorStatus::Transient,
                    format!(
                        "the grant arrived after its {:?} lease had ended locally \
                         (round trip {:?}); use a longer TTL",
                        grant.ttl,
                        sent.mono.elapsed()
                    ),
                )
                .into());
            }
            Ok(Attempt::Retry)
        }
        Ok(Ok(Acquire::Granted(grant))) => {
            ::metrics::counter!(m::ACQUIRE_SUCCESSES, "backend" => name).increment(1);
            ::metrics::histogram!(m::WAIT_SECONDS, "backend" => name)
                .record(started.elapsed().as_secs_f64());
            tracing::debug!(token = %grant.token, ttl = ?grant.ttl, "acquired");
            Ok(Attempt::Granted(LockGuard::start(
                backend.clone(),
                &client.renewer,
                request.clone(),
                grant,
                sent,
                config,
            )))
        }
        Ok(Ok(Acquire::Held(holder))) => Ok(Attempt::Held(holder)),
        Ok(Err(e)) if e.is_transient() && before_deadline(Instant::now()) => {
            tracing::debug!(error = %e, "transient error while acquiring; retrying");
            Ok(Attempt::Retry)
        }
        Ok(Err(e)) => Err(e),
        Err(_elapsed) if before_deadline(Instant::now()) => Ok(Attempt::Retry),
        Err(_elapsed) => Err(Error::OperationTimeout {
            operation: "acquire",
            after: client.op_timeout,
        }),
    }
}

/// Refuses lease data larger than 64 KiB serialized: the rule the client
/// applies to `data` before it reaches a backend, for callers that hand
/// data to a backend themselves (the lock service).
pub fn validate_data(data: &serde_json::Value) -> Result<()> {
    let len = serde_json::to_vec(data)
        .map_err(|e| Error::InvalidArgument(format!("lock data: {e}")))?
        .len();
    if len > MAX_DATA_LEN {
        return Err(Error::InvalidArgument(format!(
            "lock data is {len} bytes serialized; the limit is {MAX_DATA_LEN}"
        )));
    }
    Ok(())
}

/// Sequencer checks and re-attachment (see `docs/reentry.md`).
impl LockClient {
    /// Whether `token` is the token of the current unexpired lease on `key`:
    /// the check a resource can make with a holder's (key, token) pair when
    /// it keeps no fence of its own (Chubby's sequencer check). A `true`
    /// answer can be out of date as soon as it arrives; a fence
    /// ([`crate::Fence`]) also refuses writes that arrive late. On a key
    /// held by readers, any current reader's token is valid.
    pub async fn validate(&self, key: &str, token: FencingToken) -> Result<bool> {
        let lock_key = LockKey::new(key)?;
        let current = bounded(
            self.inner.op_timeout,
            "inspect",
            self.inner.backend.inspect(&lock_key),
        )
        .await?;
        match current {
            Some(lease) if lease.token == token => Ok(true),
            // Read-held: inspect shows one reader, and any of them is current.
            Some(lease) if lease.mode == LockMode::Shared => {
                let holders = bounded(self.inner.op_timeout, "list", self.holders(key)).await?;
                Ok(holders.iter().any(|lease| lease.token == token))
            }
            _ => Ok(false),
        }
    }

    /// Re-attaches to a lease this process (or another one) took and
    /// detached, known by its (key, owner, token): renews that exact lease
    /// to confirm it ([`Error::NotHeld`] when it is no longer current) and
    /// returns a guard renewed by this client, as [`LockRequest::acquire`]
    /// would. Await the returned request, after setting
    /// [`ttl`](ResumeRequest::ttl) or [`renew_every`](ResumeRequest::renew_every)
    /// if needed.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use fencelock_core::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let client = LockClient::new(Arc::new(MemoryBackend::new()));
    /// let guard = client.lock("job").ttl(Duration::from_secs(30)).acquire().await?;
    /// let (owner, token) = (guard.owner().clone(), guard.token());
    /// guard.detach();
    /// let again = client.resume("job", owner, token).ttl(Duration::from_secs(30)).await?;
    /// assert_eq!(again.token(), token);
    /// again.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn resume(
        &self,
        key: impl Into<String>,
        owner: Owner,
        token: FencingToken,
    ) -> ResumeRequest<'_> {
        ResumeRequest {
            request: self.lock(key).owner(owner),
            token,
        }
    }
}

/// A re-attachment being built by [`LockClient::resume`]; await it.
#[derive(Debug)]
#[must_use = "a resume request does nothing until awaited"]
pub struct ResumeRequest<'a> {
    request: LockRequest<'a>,
    token: FencingToken,
}

impl<'a> ResumeRequest<'a> {
    /// Lease length from now on (default: the client's TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.request = self.request.ttl(ttl);
        self
    }

    /// Renewal period (default: a third of the TTL), as
    /// [`LockRequest::renew_every`].
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.request = self.request.renew_every(period);
        self
    }

    async fn attach(self) -> Result<LockGuard> {
        let client = &self.request.client.inner;
        if client.renewer.is_closed() {
            return Err(Error::ClientClosed);
        }
        let (request, config) = self.request.validate()?;
        let lease = request.lease(self.token);
        let sent = Sent::now();
        let grant = bounded(
            client.op_timeout,
            "renew",
            client.backend.renew(&lease, request.ttl),
        )
        .await?;
        if Instant::now() >= sent.mono + config.clock.valid_for(grant.ttl) {
            // As for a late grant (I5): the lease may have ended already, so
            // no guard is made for it; it ends by expiry.
            return Err(crate::BackendError::message(
                client.backend.name(),
                ErrorStatus::Transient,
                format!(
                    "the renewal confirming {lease} arrived after its {:?} lease had \
                     ended locally; use a longer TTL",
                    grant.ttl
                ),
            )
            .into());
        }
        Ok(LockGuard::start(
            Arc::clone(&client.backend),
            &client.renewer,
            request,
            grant,
            sent,
            config,
        ))
    }
}

impl<'a> std::future::IntoFuture for ResumeRequest<'a> {
    type Output = Result<LockGuard>;
    type IntoFuture = futures_util::future::BoxFuture<'a, Result<LockGuard>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.attach())
    }
}

/// The read-write lock on one key: `client.rwlock(key).read()` or
/// `.write()`, each a [`LockRequest`] with the usual options (`ttl`,
/// `wait`, `kind`, `data`, …). See `docs/rwlock.md`.
///
/// Many readers or one writer. Every grant, read or write, draws its token
/// from the key's one counter, so tokens of both sides compare (I2), and
/// [`crate::Fence::admit_shared`] fences both. A writer is exactly an
/// exclusive [`LockClient::lock`] of the key: a plain lock excludes the
/// key's readers and they exclude it. A writer that waits records an
/// intent (a lease of its own, of the writer's TTL) that stops new readers,
/// so a stream of readers cannot starve it.
///
/// There is no upgrade from read to write: two readers that both try to
/// upgrade wait for each other forever. Release the read guard and take
/// the write side (re-reading what you read under it).
///
/// ```
/// # use std::sync::Arc;
/// # use fencelock_core::{LockClient, LockMode, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock_core::Error> {
/// let client = LockClient::new(Arc::new(MemoryBackend::new()));
/// let a = client.rwlock("catalog").read().acquire().await?;
/// let b = client.rwlock("catalog").read().acquire().await?;
/// assert_eq!(b.mode(), LockMode::Shared);
/// assert!(b.token() > a.token());
/// assert!(client.rwlock("catalog").write().try_acquire().await?.is_none());
/// let last_reader = b.token();
/// a.release().await?;
/// b.release().await?;
/// let writer = client.rwlock("catalog").write().acquire().await?;
/// assert!(writer.token() > last_reader);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock<'a> {
    client: &'a LockClient,
    key: String,
}

impl<'a> RwLock<'a> {
    /// The reader's side: shared with other readers. Needs a backend that
    /// claims [`crate::Capabilities::shared`] ([`Error::Unsupported`]
    /// elsewhere).
    pub fn read(&self) -> LockRequest<'a> {
        LockRequest {
            mode: LockMode::Shared,
            ..self.client.lock(self.key.clone())
        }
    }

    /// The writer's side: the same as [`LockClient::lock`] on the key.
    pub fn write(&self) -> LockRequest<'a> {
        self.client.lock(self.key.clone())
    }
}

impl LockRequest<'_> {
    /// Takes the reader's side of the key (as [`RwLock::read`]) when
    /// `shared` is true; what `fencelock run --shared` uses.
    pub fn shared(mut self, shared: bool) -> Self {
        self.mode = if shared {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        self
    }
}

/// A waiting writer's intent (`docs/rwlock.md`): posted when the key is
/// found held by a reader, refreshed while the writer keeps waiting, and
/// withdrawn when it stops waiting without a grant (a grant withdraws it on
/// the backend). Only waiting exclusive requests on backends with shared
/// locks post one; a single try never does, so it cannot block readers.
struct WriteIntent {
    /// How often the intent is refreshed, when this request posts one.
    refresh: Option<Duration>,
    posted: bool,
}

impl WriteIntent {
    fn new(client: &ClientInner, request: &AcquireRequest, wait: Duration) -> Self {
        let posts = request.mode == LockMode::Exclusive
            && !wait.is_zero()
            && client.backend.capabilities().shared;
        // Three refreshes per intent TTL: one lost refresh never lets the
        // intent lapse while the writer waits.
        Self {
            refresh: posts.then(|| request.ttl / 3),
            posted: false,
        }
    }

    /// How long the writer may sleep before it must refresh its intent.
    fn refresh_every(&self) -> Option<Duration> {
        self.refresh.filter(|_| self.posted)
    }

    /// Posts (or refreshes) the intent; a failure only costs fairness.
    async fn post(&mut self, client: &ClientInner, request: &AcquireRequest, reader: &LockInfo) {
        if self.refresh.is_none() {
            return;
        }
        let Some(intents) = client.backend.write_intents() else {
            return;
        };
        let post = intents.post_write_intent(&request.key, &request.owner, request.ttl);
        match bounded(client.op_timeout, "post_write_intent", post).await {
            Ok(()) => self.posted = true,
            Err(e) => tracing::debug!(error = %e, reader = %reader.owner,
                "could not post the writer's intent; readers may still come first"),
        }
    }

    /// Withdraws a posted intent so that readers need not wait out its TTL.
    async fn withdraw(&mut self, client: &ClientInner, request: &AcquireRequest) {
        if !std::mem::take(&mut self.posted) {
            return;
        }
        let Some(intents) = client.backend.write_intents() else {
            return;
        };
        let withdraw = intents.withdraw_write_intent(&request.key, &request.owner);
        if let Err(e) = bounded(client.op_timeout, "withdraw_write_intent", withdraw).await {
            tracing::debug!(error = %e, "could not withdraw the writer's intent; it will expire");
        }
    }
}

/// A waiting acquisition's entry in a fair backend's queue
/// (`docs/fairness.md`). Each attempt of the wait carries
/// [`AcquireRequest::queue`], which posts or refreshes the entry; the entry
/// is a lease of the request's TTL, so the wait retries at least every
/// third of it and the entry never lapses while its waiter lives. A wait
/// that ends without a grant withdraws it: awaited when the wait returns an
/// error, and in a background task when the wait's future is dropped, so
/// that cancellation never blocks. If that withdrawal fails (or there is no
/// runtime left to run it), the entry ends by expiry, at most one TTL later.
struct QueueEntry {
    backend: Arc<dyn Backend>,
    key: LockKey,
    owner: Owner,
    ttl: Duration,
    op_timeout: Duration,
    /// Whether an entry may exist on the backend.
    armed: bool,
}

impl QueueEntry {
    /// An entry for waiting exclusive requests to backends that claim
    /// `fair`; a single try never queues, so it leaves nothing behind.
    fn new(client: &ClientInner, request: &AcquireRequest, wait: Duration) -> Option<Self> {
        let queues = request.mode == LockMode::Exclusive
            && !wait.is_zero()
            && client.backend.capabilities().fair;
        queues.then(|| Self {
            backend: Arc::clone(&client.backend),
            key: request.key.clone(),
            owner: request.owner.clone(),
            ttl: request.ttl,
            op_timeout: client.op_timeout,
            armed: true,
        })
    }

    /// How long the waiter may sleep before an attempt must refresh the
    /// entry: three refreshes per TTL, so that one slow or lost attempt
    /// never lets the entry lapse.
    fn refresh_every(&self) -> Duration {
        self.ttl / 3
    }

    /// The backend removed the entry with the grant.
    fn granted(&mut self) {
        self.armed = false;
    }

    /// Withdraws the entry now, so the next waiter need not wait out its TTL.
    async fn leave(mut self) {
        self.armed = false;
        leave_queue(&*self.backend, &self.key, &self.owner, self.op_timeout).await;
    }
}

impl Drop for QueueEntry {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no runtime to leave the queue; the entry will expire");
            return;
        };
        let (backend, key, owner) = (
            Arc::clone(&self.backend),
            self.key.clone(),
            self.owner.clone(),
        );
        let op_timeout = self.op_timeout;
        runtime.spawn(async move { leave_queue(&*backend, &key, &owner, op_timeout).await });
    }
}

/// One bounded [`crate::FairQueue::leave_queue`]; a failure only costs the
/// next waiter up to the entry's TTL.
async fn leave_queue(backend: &dyn Backend, key: &LockKey, owner: &Owner, op_timeout: Duration) {
    let Some(queue) = backend.fair_queue() else {
        return;
    };
    if let Err(e) = bounded(op_timeout, "leave_queue", queue.leave_queue(key, owner)).await {
        tracing::debug!(error = %e, "could not leave the queue; the entry will expire");
    }
}

/// Releases a grant whose answer came back too late to be trusted (see
/// `acquire_loop`); a failure only means the lease ends by expiry instead.
async fn give_back_late_grant(
    client: &ClientInner,
    request: &AcquireRequest,
    grant: &Grant,
    sent: Sent,
) {
    tracing::warn!(
        token = %grant.token, ttl = ?grant.ttl, round_trip = ?sent.mono.elapsed(),
        "grant arrived after its lease had ended locally; releasing it"
    );
    let lease = request.lease(grant.token);
    match tokio::time::timeout(client.op_timeout, client.backend.release(&lease)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "could not release the late grant; it will expire");
        }
        Err(_) => tracing::debug!("releasing the late grant timed out; it will expire"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_time_is_shorter_than_the_lease() {
        let p = ClockPolicy::default();
        for ms in [1, 10, 100, 3_000, 30_000, 600_000] {
            let ttl = Duration::from_millis(ms);
            let trusted = p.valid_for(ttl);
            assert!(trusted < ttl, "{ttl:?}");
            assert!(trusted >= ttl.mul_f64(0.85), "{ttl:?} -> {trusted:?}");
        }
        assert_eq!(
            p.valid_for(Duration::from_secs(30)),
            Duration::from_millis(29_200)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_ttl_below_the_minimum_is_refused_naming_it() {
        let client = LockClient::new(Arc::new(crate::MemoryBackend::new()));
        for short in [Duration::from_millis(1), Duration::from_millis(99)] {
            match client.lock("k").ttl(short).acquire().await {
                Err(Error::InvalidTtl(message)) => assert!(message.contains("100ms"), "{message}"),
                other => panic!("{short:?}: {other:?}"),
            }
        }
        let builder = LockClient::builder(Arc::new(crate::MemoryBackend::new()));
        assert!(matches!(
            builder.ttl(Duration::from_millis(1)).build(),
            Err(Error::InvalidTtl(_))
        ));
        let guard = client
            .lock("k")
            .ttl(Duration::from_millis(100))
            .acquire()
            .await;
        assert!(guard.is_ok(), "{guard:?}");
    }
}
