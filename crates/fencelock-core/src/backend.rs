//! The contract between the client and a storage engine (see
//! `docs/architecture.md`).

use std::{fmt, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{
    changes::ChangeFeed,
    error::{Error, Result},
    types::{FencingToken, LeaseId, LockInfo, LockKey, LockMode, Owner},
    wake::WakeSubscription,
    watch::Watch,
};

mod admin;
mod intents;
mod queue;

pub use admin::{BackendAdmin, Stats};
pub use intents::WriteIntents;
pub use queue::FairQueue;

/// A request for a lease, already validated by the client.
///
/// Built with [`AcquireRequest::new`] and the `with_*` methods, so that a
/// field added later never breaks a backend or a caller.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock.
    pub key: LockKey,
    /// Who asks.
    pub owner: Owner,
    /// Requested lease length (within [`crate::validate_ttl`] bounds).
    pub ttl: Duration,
    /// Optional label stored with the lease.
    pub kind: Option<String>,
    /// Optional JSON metadata stored with the lease.
    pub data: Option<serde_json::Value>,
    /// When set, the grant's token must be greater than this floor as well
    /// as greater than every token issued for the key before (I2). Quorum and
    /// sharded backends use it to keep tokens monotonic across nodes and
    /// shard moves. Only backends whose [`Capabilities::min_token`] is true
    /// receive a request with a floor; the client refuses it for the others.
    pub min_token: Option<FencingToken>,
    /// This attempt belongs to a waiting acquisition (`docs/fairness.md`):
    /// on a backend that claims [`Capabilities::fair`], a refused attempt
    /// leaves (or refreshes) the owner's queue entry on the key, itself a
    /// lease of [`AcquireRequest::ttl`], and a grant goes only to the oldest
    /// live entry. The client sets it only for waiting exclusive requests
    /// to backends that claim `fair`, and calls [`FairQueue::leave_queue`]
    /// when the wait ends without a grant. Never set for a one-shot try.
    pub queue: bool,
    /// Which side of the key is asked for: a plain lock or writer
    /// ([`LockMode::Exclusive`], the default) or a reader
    /// ([`LockMode::Shared`], only sent to backends that claim
    /// [`Capabilities::shared`]; see `docs/rwlock.md`).
    pub mode: LockMode,
}

impl AcquireRequest {
    /// A request for `key` as `owner` for `ttl`, without label, data or floor.
    pub fn new(key: LockKey, owner: Owner, ttl: Duration) -> Self {
        Self {
            key,
            owner,
            ttl,
            kind: None,
            data: None,
            min_token: None,
            queue: false,
            mode: LockMode::Exclusive,
        }
    }

    /// Asking for `mode` (see [`AcquireRequest::mode`]).
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// [`crate::Error::Unsupported`] for a reader's request: what a backend
    /// without read-write locks answers one.
    pub fn exclusive_only(&self, backend: &'static str) -> crate::Result<()> {
        match self.mode {
            LockMode::Exclusive => Ok(()),
            LockMode::Shared => Err(Error::unsupported(backend, "shared locks")),
        }
    }

    /// As part of a waiting acquisition (see [`AcquireRequest::queue`]).
    pub fn with_queue(mut self, queue: bool) -> Self {
        self.queue = queue;
        self
    }

    /// With a label.
    pub fn with_kind(mut self, kind: Option<String>) -> Self {
        self.kind = kind;
        self
    }

    /// With JSON metadata.
    pub fn with_data(mut self, data: Option<serde_json::Value>) -> Self {
        self.data = data;
        self
    }

    /// With a token floor (see [`AcquireRequest::min_token`]).
    pub fn with_min_token(mut self, floor: Option<FencingToken>) -> Self {
        self.min_token = floor;
        self
    }

    /// The request's floor as a number, 0 when it has none; a floor above
    /// [`FencingToken::MAX_FLOOR`] is [`crate::Error::InvalidArgument`].
    pub fn floor(&self) -> crate::Result<u64> {
        self.min_token.map_or(Ok(0), |f| {
            FencingToken::check_floor(f).map(FencingToken::get)
        })
    }

    /// `token` as this request's grant, or [`crate::Error::TokensExhausted`]
    /// when the counter that drew it passed [`FencingToken::MAX`].
    pub fn issued(&self, token: u64) -> crate::Result<FencingToken> {
        if token > FencingToken::MAX.get() {
            return Err(crate::Error::TokensExhausted {
                key: self.key.clone(),
            });
        }
        Ok(FencingToken(token))
    }

    /// The lease this request becomes once granted `token`.
    pub fn lease(&self, token: FencingToken) -> LeaseId {
        LeaseId::new(self.key.clone(), self.owner.clone(), token).with_mode(self.mode)
    }
}

/// A lease the backend granted or extended.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of the lease (unchanged by renewal).
    pub token: FencingToken,
    /// The lease length the backend actually granted, which may exceed the
    /// request (etcd rounds small TTLs up). The guard's local deadline follows
    /// this value, never a longer one.
    pub ttl: Duration,
    /// When the lease ends, on the backend's clock (for display only).
    pub expires_at: DateTime<Utc>,
}

impl Grant {
    /// A grant of `token` for `ttl`, ending at `expires_at` on the backend's
    /// clock.
    pub fn new(token: FencingToken, ttl: Duration, expires_at: DateTime<Utc>) -> Self {
        Self {
            token,
            ttl,
            expires_at,
        }
    }
}

/// The answer to [`Backend::try_acquire`].
#[derive(Clone, Debug, PartialEq)]
pub enum Acquire {
    /// The caller holds the key now.
    Granted(Grant),
    /// Someone else holds an unexpired lease. Backends that learn the holder in
    /// the same round trip return it, so a waiter can sleep no longer than the
    /// holder's remaining lease.
    Held(Option<LockInfo>),
}

/// The answer to [`Backend::try_acquire_all`]: every key, or none.
#[derive(Clone, Debug, PartialEq)]
pub enum AcquireAll {
    /// The caller holds every key now: one grant per request, in request
    /// order.
    Granted(Vec<Grant>),
    /// Nothing was granted (and nothing of this call stays held): the
    /// request at `index` found its key held, by `holder` where the backend
    /// learns it in the same round trip.
    Held {
        /// Which request's key was held.
        index: usize,
        /// Its holder, as in [`Acquire::Held`].
        holder: Option<LockInfo>,
    },
}

/// One lease to extend in a [`Backend::renew_many`] batch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewal {
    /// The lease, whose [`LeaseId::mode`] says which side of its key it
    /// holds.
    pub lease: LeaseId,
    /// The new lease length, from now on the backend's clock.
    pub ttl: Duration,
    /// How long the caller waits for the batch's answer; `None`: a third
    /// of the lease, as the client's renewer waits by default. See
    /// [`part_bound`].
    pub within: Option<Duration>,
}

impl Renewal {
    /// Extend `lease` to `ttl` from now.
    pub fn new(lease: LeaseId, ttl: Duration) -> Self {
        Self {
            lease,
            ttl,
            within: None,
        }
    }

    /// The caller gives up on the batch's answer after `within` (the
    /// client's renewer: a third of the lease, or its operation time-out if
    /// that is shorter).
    pub fn answered_within(mut self, within: Duration) -> Self {
        self.within = Some(within);
        self
    }
}

/// How long one part of a batch may take, for a backend that splits a
/// batch over servers that fail independently (a Redis Cluster's slots, a
/// sharded map's stores): three quarters of the soonest any of the
/// batch's callers stops waiting ([`Renewal::within`]). A server that does
/// not answer then fails its own part's leases only, and the other parts'
/// answers reach the caller before it gives up on the whole batch, where
/// one silent server used to cost every lease of the batch its renewal.
///
/// ```
/// # use std::time::Duration;
/// # use fencelock_core::{part_bound, LeaseId, LockKey, Owner, Renewal, FencingToken};
/// let lease = LeaseId::new(LockKey::new("k").unwrap(), Owner::new("o").unwrap(), FencingToken(1));
/// let renewal = Renewal::new(lease, Duration::from_secs(9));
/// assert_eq!(part_bound(std::slice::from_ref(&renewal)), Duration::from_millis(2250));
/// let impatient = renewal.answered_within(Duration::from_secs(1));
/// assert_eq!(part_bound(&[impatient]), Duration::from_millis(750));
/// ```
pub fn part_bound(renewals: &[Renewal]) -> Duration {
    let waited = renewals
        .iter()
        .map(|r| r.within.unwrap_or(r.ttl / 3))
        .min()
        .unwrap_or_default();
    waited * 3 / 4
}

/// Runs one part of a split batch (see [`part_bound`]) for at most
/// `bound`; a part that takes longer fails with
/// [`Error::OperationTimeout`], a transient error, for its leases only.
pub async fn renew_part<T>(
    bound: Duration,
    part: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(bound, part)
        .await
        .unwrap_or(Err(Error::OperationTimeout {
            operation: "renew",
            after: bound,
        }))
}

/// What a backend can do beyond the required operations.
///
/// Start from [`Capabilities::default`] (nothing claimed) and set what the
/// backend offers; the conformance suite checks every claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Backend::subscribe`] delivers release wake-ups, so waiters need not poll.
    pub wakeups: bool,
    /// Leases and token counters outlive the process (a reopened backend sees
    /// them). False only for the in-process memory backend.
    pub persistent: bool,
    /// Expired leases stay stored until `cleanup` or a takeover removes them
    /// (SQL backends, memory), so `stats` counts them; false where the engine
    /// deletes them itself (Redis key expiry, etcd lease revocation).
    pub keeps_expired: bool,
    /// [`AcquireRequest::min_token`] is honoured: the grant's token is above
    /// the floor.
    pub min_token: bool,
    /// [`Backend::watch`] streams holder changes, expiries included.
    pub watch: bool,
    /// [`Backend::renew_many`] renews a batch in one round trip rather than
    /// one call per lease.
    pub batch_renew: bool,
    /// [`Backend::set_data`] replaces a held lease's JSON data in one atomic
    /// step (what an election leader's `proclaim` uses).
    pub set_data: bool,
    /// Read-write locks: shared requests and leases ([`LockMode::Shared`]),
    /// writer intents ([`Backend::write_intents`]), and an exclusive
    /// [`Backend::try_acquire`] that waits for readers (`docs/rwlock.md`).
    pub shared: bool,
    /// [`Backend::try_acquire_all`] takes several keys in one atomic step
    /// (one transaction, script or Txn): all of them or none
    /// (`docs/multi-key.md`).
    pub atomic_multi: bool,
    /// Waiters are granted in the order they started waiting
    /// (`docs/fairness.md`): [`AcquireRequest::queue`] leaves a queue entry
    /// ordered by the engine itself (etcd create revisions, ZooKeeper
    /// sequential nodes), [`Backend::fair_queue`] withdraws and
    /// lists the entries.
    pub fair: bool,
    /// [`Backend::try_acquire_waiting`] waits for a held key where the key
    /// is (a lock service waits with its own backend's wake-ups and answers
    /// at once with the grant), so a waiting client needs no wake-up
    /// subscription and no second round trip after a release.
    pub waits: bool,
    /// Leases belong to the backend's session with the engine, as
    /// Curator's and kazoo's locks do (ZooKeeper's `layout=curator`): they
    /// go when that session closes or expires (a crashed holder's lease
    /// with its session, a dropped waiter's queue entry at once), only the
    /// backend that took a lease can renew it (so `resume` works only
    /// through that backend), and a grant may be shorter than asked
    /// ([`Grant::ttl`] says how long; the guard renews in step).
    pub session_bound: bool,
}

impl Capabilities {
    /// Claims release wake-ups.
    pub fn with_wakeups(mut self, yes: bool) -> Self {
        self.wakeups = yes;
        self
    }

    /// Claims leases that outlive the process.
    pub fn with_persistent(mut self, yes: bool) -> Self {
        self.persistent = yes;
        self
    }

    /// Claims that expired leases stay stored until cleanup.
    pub fn with_keeps_expired(mut self, yes: bool) -> Self {
        self.keeps_expired = yes;
        self
    }

    /// Claims support for token floors.
    pub fn with_min_token(mut self, yes: bool) -> Self {
        self.min_token = yes;
        self
    }

    /// Claims a holder-change stream.
    pub fn with_watch(mut self, yes: bool) -> Self {
        self.watch = yes;
        self
    }

    /// Claims one-round-trip batched renewal.
    pub fn with_batch_renew(mut self, yes: bool) -> Self {
        self.batch_renew = yes;
        self
    }

    /// Claims [`Backend::set_data`].
    pub fn with_set_data(mut self, yes: bool) -> Self {
        self.set_data = yes;
        self
    }

    /// Claims atomic multi-key acquisition ([`Capabilities::atomic_multi`]).
    pub fn with_atomic_multi(mut self, yes: bool) -> Self {
        self.atomic_multi = yes;
        self
    }

    /// Claims FIFO grants to waiters ([`Capabilities::fair`]).
    pub fn with_fair(mut self, yes: bool) -> Self {
        self.fair = yes;
        self
    }

    /// Claims waiting attempts ([`Capabilities::waits`]).
    pub fn with_waits(mut self, yes: bool) -> Self {
        self.waits = yes;
        self
    }

    /// Claims leases bound to the backend's session
    /// ([`Capabilities::session_bound`]).
    pub fn with_session_bound(mut self, yes: bool) -> Self {
        self.session_bound = yes;
        self
    }

    /// Claims read-write locks ([`Capabilities::shared`]).
    pub fn with_shared(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }
}

/// A storage engine for locks.
///
/// Every method is **one atomic step** on the backend (one statement, script,
/// transaction or Txn), and every lease decision uses the backend's clock (I4).
/// The invariants each implementation must keep are I1–I6 of
/// `docs/semantics.md`; the conformance suite in `fencelock-testkit` checks
/// them, and checks every claim of [`Backend::capabilities`].
///
/// Implementations classify their failures ([`crate::BackendError`] with an
/// [`crate::ErrorStatus`]) and report "this lease is not held" the same way
/// everywhere: [`crate::Error::NotHeld`], from [`Backend::renew`],
/// [`Backend::release`] and each item of [`Backend::renew_many`].
///
/// The trait holds the lease operations only; the rest a backend may offer
/// lives in extension traits it hands out through an accessor:
/// [`BackendAdmin`] (listing, statistics, force-release, cleanup),
/// [`FairQueue`] (FIFO waiters, with [`Capabilities::fair`]) and
/// [`WriteIntents`] (readers held back for a waiting writer, with
/// [`Capabilities::shared`]). A lease's side of a read-write lock travels in
/// the request and the lease ([`AcquireRequest::mode`], [`LeaseId::mode`]).
///
/// Methods added after the first release have default implementations
/// (answering [`crate::Error::Unsupported`] or composing the required
/// methods), so a new capability never breaks an existing backend, and a
/// new engine implements only the required lease operations.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// Short name for logs and metrics: `memory`, `sqlite`, `postgres`, …
    fn name(&self) -> &'static str;

    /// What this backend offers beyond the required operations.
    fn capabilities(&self) -> Capabilities;

    /// Takes `key` in the request's [`mode`](AcquireRequest::mode), drawing
    /// a new token greater than every token issued for `key` before (I1,
    /// I2, I6) and, when the request carries one, greater than its
    /// [`min_token`](AcquireRequest::min_token).
    ///
    /// An exclusive request is granted when `key` is free or its lease has
    /// expired. On a backend that claims [`Capabilities::shared`] it is the
    /// writer's side of a read-write lock (`docs/rwlock.md`): it is also
    /// refused while an unexpired reader holds `key` (answering
    /// [`Acquire::Held`] with that reader, [`LockMode::Shared`]), and a grant
    /// withdraws the requesting owner's writer intent on `key`.
    ///
    /// A shared request (a reader) is granted while no unexpired exclusive
    /// lease and no unexpired writer intent (of any owner: tasks of one
    /// process share it) exists on `key`, whatever readers hold it, with a
    /// token from the same per-key counter (I2 across both modes); otherwise
    /// [`Acquire::Held`] with the writer, if any. A backend without
    /// read-write locks answers [`crate::Error::Unsupported`]
    /// ([`AcquireRequest::exclusive_only`]).
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire>;

    /// [`Backend::try_acquire`] that may wait up to `wait` for a held key
    /// before answering [`Acquire::Held`]; a grant is answered as soon as
    /// it is made. Backends that claim [`Capabilities::waits`] implement
    /// it; the client calls it only for waiting exclusive acquisitions that
    /// keep no queue entry, with `wait` short enough that the lease it
    /// counts from before the call is still worth having. The default is
    /// one try that does not wait.
    async fn try_acquire_waiting(
        &self,
        request: &AcquireRequest,
        wait: Duration,
    ) -> Result<Acquire> {
        let _ = wait;
        self.try_acquire(request).await
    }

    /// Takes every key of `requests` in one atomic step, each as
    /// [`Backend::try_acquire`] would (its own token, above its floor, I1 and
    /// I2 per key), or none of them: [`AcquireAll::Held`] names a key held
    /// elsewhere and leaves every other key as it was. The client sends
    /// distinct keys in sorted order, all exclusive and for one owner, so
    /// that two overlapping calls lock rows in the same order and cannot
    /// deadlock.
    ///
    /// Backends that offer it claim [`Capabilities::atomic_multi`]. One may
    /// still answer [`crate::Error::Unsupported`] for a set it cannot take
    /// atomically (Redis Cluster keys in different hash slots); the client
    /// then takes the keys one by one. The default answers
    /// [`crate::Error::Unsupported`].
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let _ = requests;
        Err(Error::unsupported(
            self.name(),
            "atomic multi-key acquisition",
        ))
    }

    /// Extends `lease` (in its [`mode`](LeaseId::mode)) to `ttl` from now,
    /// only if that exact lease is current and unexpired (I3); otherwise
    /// [`crate::Error::NotHeld`]. A backend that cannot change a lease's
    /// length reports the length it did extend by in [`Grant::ttl`].
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant>;

    /// Extends every lease of the batch, each as [`Backend::renew`] would,
    /// and answers one result per renewal, in order. The outer error means
    /// the batch as a whole got no answer (nothing is known of any lease).
    /// A batch may mix exclusive and shared leases ([`renew_each_mode`]
    /// splits one for a backend that renews each side separately).
    ///
    /// The default renews one lease after another; backends that can do it
    /// in one round trip override it and claim
    /// [`Capabilities::batch_renew`].
    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        renew_one_by_one(self, renewals).await
    }

    /// Removes `lease` (in its [`mode`](LeaseId::mode)) only if it is
    /// current (I3) and wakes waiters; otherwise [`crate::Error::NotHeld`].
    async fn release(&self, lease: &LeaseId) -> Result<()>;

    /// The current unexpired lease on `key`, if any.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>>;

    /// Subscribes to release wake-ups for `key`, or `None` when this backend
    /// has no such signal (waiters then back off with jitter). Callers
    /// subscribe *before* trying, so a release between the try and the wait is
    /// not missed.
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        let _ = key;
        Ok(None)
    }

    /// A stream of the holder changes of `key` from now on: acquisitions,
    /// releases and expiries (see [`crate::HolderChange`]). Backends that offer it
    /// claim [`Capabilities::watch`]; the default answers
    /// [`crate::Error::Unsupported`].
    async fn watch(&self, key: &LockKey) -> Result<Watch> {
        let _ = key;
        Err(Error::unsupported(self.name(), "watch"))
    }

    /// Notices of the keys whose holder changes anywhere in the store from
    /// now on, whoever changes it: every grant and every release
    /// (force-releases included), but neither renewals nor expiries (see
    /// [`crate::ChangeFeed`]). What the lock service's event stream follows
    /// instead of listing the whole store (`docs/http.md#events`). `None`
    /// when this backend is not told of such changes (the default).
    async fn changes(&self) -> Result<Option<ChangeFeed>> {
        Ok(None)
    }

    /// Replaces the JSON data of `lease` (its token, owner, expiry and kind
    /// unchanged), only if that exact lease is current and unexpired (I3);
    /// otherwise [`crate::Error::NotHeld`]. One atomic step, like
    /// [`Backend::renew`]. Backends that offer it claim
    /// [`Capabilities::set_data`]; the default answers
    /// [`crate::Error::Unsupported`].
    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let _ = (lease, data);
        Err(Error::unsupported(self.name(), "set_data"))
    }

    /// The operator's operations on this backend's lock table, or `None`
    /// when it offers none (the default). `administer()` on a
    /// `dyn Backend` turns `None` into [`crate::Error::Unsupported`].
    fn admin(&self) -> Option<&dyn BackendAdmin> {
        None
    }

    /// The queue of waiters on a key, offered by backends that claim
    /// [`Capabilities::fair`]; `None` (the default) for the others, which
    /// keep no queue.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        None
    }

    /// Writer intents, offered by backends that claim
    /// [`Capabilities::shared`]; `None` (the default) for the others.
    fn write_intents(&self) -> Option<&dyn WriteIntents> {
        None
    }
}

/// Inside `impl Backend for T`, the accessors of the extension traits `T`
/// implements itself, each answering `Some(self)`:
///
/// ```
/// # use std::time::Duration;
/// # use fencelock_core::*;
/// #[derive(Debug)]
/// struct Engine;
///
/// #[async_trait]
/// impl Backend for Engine {
///     # fn name(&self) -> &'static str { "engine" }
///     # fn capabilities(&self) -> Capabilities { Capabilities::default() }
///     # async fn try_acquire(&self, _: &AcquireRequest) -> Result<Acquire> { Ok(Acquire::Held(None)) }
///     # async fn renew(&self, l: &LeaseId, _: Duration) -> Result<Grant> { Err(Error::not_held(l)) }
///     # async fn release(&self, l: &LeaseId) -> Result<()> { Err(Error::not_held(l)) }
///     # async fn inspect(&self, _: &LockKey) -> Result<Option<LockInfo>> { Ok(None) }
///     // … the lease operations …
///     fencelock_core::offers!(admin);
/// }
///
/// #[async_trait]
/// impl BackendAdmin for Engine {
///     // … list, force_release, release_all, cleanup_expired, stats …
///     # async fn list(&self, _: Option<&str>) -> Result<Vec<LockInfo>> { Ok(Vec::new()) }
///     # async fn force_release(&self, _: &LockKey) -> Result<Option<LockInfo>> { Ok(None) }
///     # async fn release_all(&self, _: &Owner) -> Result<u64> { Ok(0) }
///     # async fn cleanup_expired(&self) -> Result<u64> { Ok(0) }
///     # async fn stats(&self) -> Result<Stats> { Ok(Stats::default()) }
/// }
///
/// let engine: &dyn Backend = &Engine;
/// assert!(engine.admin().is_some() && engine.fair_queue().is_none());
/// ```
///
/// An engine that offers one only in some configurations writes that
/// accessor itself.
#[macro_export]
macro_rules! offers {
    ($($accessor:ident),+ $(,)?) => {
        $($crate::offers!(@one $accessor);)+
    };
    (@one admin) => {
        fn admin(&self) -> Option<&dyn $crate::BackendAdmin> {
            Some(self)
        }
    };
    (@one fair_queue) => {
        fn fair_queue(&self) -> Option<&dyn $crate::FairQueue> {
            Some(self)
        }
    };
    (@one write_intents) => {
        fn write_intents(&self) -> Option<&dyn $crate::WriteIntents> {
            Some(self)
        }
    };
}

impl dyn Backend + '_ {
    /// This backend's [`BackendAdmin`], or [`crate::Error::Unsupported`]
    /// when it offers none: what every caller of an operator's operation
    /// through a `dyn Backend` starts with.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use fencelock_core::{Backend, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fencelock_core::Result<()> {
    ///
    /// let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    /// assert!(backend.administer()?.list(None).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn administer(&self) -> Result<&dyn BackendAdmin> {
        self.admin()
            .ok_or_else(|| Error::unsupported(self.name(), "administration"))
    }
}

/// Renews each lease of a batch with its own [`Backend::renew`], one after
/// another: the default [`Backend::renew_many`], and what an engine without
/// a batch statement for one side of a read-write lock uses for that side.
pub async fn renew_one_by_one<B: Backend + ?Sized>(
    backend: &B,
    renewals: &[Renewal],
) -> Result<Vec<Result<Grant>>> {
    let mut results = Vec::with_capacity(renewals.len());
    for renewal in renewals {
        results.push(backend.renew(&renewal.lease, renewal.ttl).await);
    }
    Ok(results)
}

/// [`Backend::renew_many`] for an engine with a batch statement for the
/// writers' side only: the writers' leases in one `writers` call, the
/// readers' one by one through [`Backend::renew`], both at once (see
/// [`renew_each_mode`]).
pub async fn renew_writers_batched<B, F, Fut>(
    backend: &B,
    renewals: &[Renewal],
    writers: F,
) -> Result<Vec<Result<Grant>>>
where
    B: Backend + ?Sized,
    F: Fn(Vec<Renewal>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<Grant>>>>,
{
    let writers = &writers;
    renew_each_mode(backend.name(), renewals, |mode, batch| async move {
        match mode {
            LockMode::Exclusive => writers(batch).await,
            LockMode::Shared => renew_one_by_one(backend, &batch).await,
        }
    })
    .await
}

/// Renews one lease with a batch call, for an engine whose only renewal
/// statement takes a batch: the batch's one answer, or
/// [`crate::Error::NotHeld`] if it answered none.
pub async fn renew_alone<F, Fut>(lease: &LeaseId, ttl: Duration, renew_batch: F) -> Result<Grant>
where
    F: FnOnce(Vec<Renewal>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<Grant>>>>,
{
    let mut answers = renew_batch(vec![Renewal::new(lease.clone(), ttl)]).await?;
    answers.pop().unwrap_or_else(|| Err(Error::not_held(lease)))
}

/// Renews a batch that may mix exclusive and shared leases, for a backend
/// that renews each side with its own statement or script: `renew` gets
/// each side's part (never an empty one), both sides run concurrently, and
/// the answers come back in the batch's order. A side whose call failed as
/// a whole answers that error for each of its leases, so that one side's
/// failure says nothing about the other's.
pub async fn renew_each_mode<F, Fut>(
    backend: &'static str,
    renewals: &[Renewal],
    renew: F,
) -> Result<Vec<Result<Grant>>>
where
    F: Fn(LockMode, Vec<Renewal>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<Grant>>>>,
{
    let (shared, exclusive): (Vec<_>, Vec<_>) = renewals
        .iter()
        .cloned()
        .enumerate()
        .partition(|(_, r)| r.lease.mode == LockMode::Shared);
    if shared.is_empty() || exclusive.is_empty() {
        let mode = renewals
            .first()
            .map_or(LockMode::Exclusive, |r| r.lease.mode);
        return renew(mode, renewals.to_vec()).await;
    }
    let (exclusive_at, exclusive): (Vec<usize>, Vec<Renewal>) = exclusive.into_iter().unzip();
    let (shared_at, shared): (Vec<usize>, Vec<Renewal>) = shared.into_iter().unzip();
    let (exclusive_results, shared_results) = tokio::join!(
        renew(LockMode::Exclusive, exclusive),
        renew(LockMode::Shared, shared)
    );
    let mut answers: Vec<(usize, Result<Grant>)> = exclusive_at
        .iter()
        .copied()
        .zip(each_answered(
            backend,
            exclusive_results,
            exclusive_at.len(),
        ))
        .chain(shared_at.iter().copied().zip(each_answered(
            backend,
            shared_results,
            shared_at.len(),
        )))
        .collect();
    answers.sort_by_key(|(at, _)| *at);
    Ok(answers.into_iter().map(|(_, answer)| answer).collect())
}

/// One answer per lease of a batch of `count`: the batch's own, or its
/// failure (a failed call, or a wrong number of answers) for each lease.
pub(crate) fn each_answered(
    backend: &'static str,
    batch: Result<Vec<Result<Grant>>>,
    count: usize,
) -> Vec<Result<Grant>> {
    match batch {
        Ok(results) if results.len() == count => results,
        Ok(results) => {
            let message = format!(
                "renew_many answered {} results for {count} leases",
                results.len()
            );
            (0..count)
                .map(|_| {
                    Err(crate::BackendError::message(
                        backend,
                        crate::ErrorStatus::Transient,
                        message.clone(),
                    )
                    .into())
                })
                .collect()
        }
        Err(e) => (0..count).map(|_| Err(e.duplicate(backend))).collect(),
    }
}
