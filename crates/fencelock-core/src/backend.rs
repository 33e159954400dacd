//! The contract between the client and a storage engine (see
//! `docs/architecture.md`).

use std::{collections::BTreeMap, fmt, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{
    changes::ChangeFeed,
    error::Result,
    types::{FencingToken, LeaseId, LockInfo, LockKey, Owner},
    wake::WakeSubscription,
    watch::Watch,
};

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
    /// to backends that claim `fair`, and calls [`Backend::leave_queue`]
    /// when the wait ends without a grant. Never set for a one-shot try.
    pub queue: bool,
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
        LeaseId::new(self.key.clone(), self.owner.clone(), token)
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
    /// The lease.
    pub lease: LeaseId,
    /// The new lease length, from now on the backend's clock.
    pub ttl: Duration,
}

impl Renewal {
    /// Extend `lease` to `ttl` from now.
    pub fn new(lease: LeaseId, ttl: Duration) -> Self {
        Self { lease, ttl }
    }
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
    /// Read-write locks: [`Backend::try_acquire_shared`] and the other
    /// reader operations, writer intents, and an exclusive
    /// [`Backend::try_acquire`] that waits for readers (`docs/rwlock.md`).
    pub shared: bool,
    /// [`Backend::try_acquire_all`] takes several keys in one atomic step
    /// (one transaction, script or Txn): all of them or none
    /// (`docs/multi-key.md`).
    pub atomic_multi: bool,
    /// Waiters are granted in the order they started waiting
    /// (`docs/fairness.md`): [`AcquireRequest::queue`] leaves a queue entry
    /// ordered by the engine itself (etcd create revisions, ZooKeeper
    /// sequential nodes), [`Backend::leave_queue`] withdraws it, and
    /// [`Backend::queue`] lists the live entries.
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

/// Operator statistics about a backend's lock table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Stats {
    /// Unexpired leases.
    pub held: u64,
    /// Unexpired leases by kind (`""` for leases without one).
    pub held_by_kind: BTreeMap<String, u64>,
    /// Unexpired leases by owner.
    pub held_by_owner: BTreeMap<String, u64>,
    /// Mean time the current leases have been held so far, in seconds.
    pub avg_hold_seconds: Option<f64>,
    /// Longest time a current lease has been held so far, in seconds.
    pub max_hold_seconds: Option<f64>,
    /// Expired leases still stored (what `cleanup` would delete). Always 0 on
    /// backends where the engine itself deletes expired leases (Redis, etcd).
    pub expired_not_cleaned: u64,
}

impl Stats {
    /// Builds statistics from the unexpired leases and hold times computed on
    /// the backend's clock; backends that fetch leases then summarise use this
    /// so that every backend counts the same way.
    pub fn from_leases<'a>(
        leases: impl IntoIterator<Item = (&'a LockInfo, Duration)>,
        expired_not_cleaned: u64,
    ) -> Self {
        let mut stats = Stats {
            expired_not_cleaned,
            ..Stats::default()
        };
        let mut total = 0.0;
        let mut max: Option<f64> = None;
        for (lease, held_for) in leases {
            stats.held += 1;
            *stats
                .held_by_kind
                .entry(lease.kind.clone().unwrap_or_default())
                .or_default() += 1;
            *stats
                .held_by_owner
                .entry(lease.owner.to_string())
                .or_default() += 1;
            let secs = held_for.as_secs_f64();
            total += secs;
            max = Some(max.map_or(secs, |m: f64| m.max(secs)));
        }
        if stats.held > 0 {
            stats.avg_hold_seconds = Some(total / stats.held as f64);
        }
        stats.max_hold_seconds = max;
        stats
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
/// Methods added after the first release have default implementations
/// (answering [`crate::Error::Unsupported`] or composing the required
/// methods), so a new capability never breaks an existing backend.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// Short name for logs and metrics: `memory`, `sqlite`, `postgres`, …
    fn name(&self) -> &'static str;

    /// What this backend offers beyond the required operations.
    fn capabilities(&self) -> Capabilities;

    /// Takes `key` if it is free or its lease has expired, drawing a new
    /// token greater than every token issued for `key` before (I1, I2, I6)
    /// and, when the request carries one, greater than its
    /// [`min_token`](AcquireRequest::min_token).
    ///
    /// On a backend that claims [`Capabilities::shared`] this is the
    /// writer's side of a read-write lock: it is also refused while an
    /// unexpired reader holds `key` (answering
    /// [`Acquire::Held`] with that reader, [`crate::LockMode::Shared`]), and a
    /// grant withdraws the requesting owner's writer intent on `key`.
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
    /// distinct keys in sorted order, all for one owner, so that two
    /// overlapping calls lock rows in the same order and cannot deadlock.
    ///
    /// Backends that offer it claim [`Capabilities::atomic_multi`]. One may
    /// still answer [`crate::Error::Unsupported`] for a set it cannot take
    /// atomically (Redis Cluster keys in different hash slots); the client
    /// then takes the keys one by one. The default answers
    /// [`crate::Error::Unsupported`].
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let _ = requests;
        Err(crate::Error::unsupported(
            self.name(),
            "atomic multi-key acquisition",
        ))
    }

    /// Extends `lease` to `ttl` from now, only if that exact lease is current
    /// and unexpired (I3); otherwise [`crate::Error::NotHeld`]. A backend
    /// that cannot change a lease's length reports the length it did extend
    /// by in [`Grant::ttl`].
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant>;

    /// Extends every lease of the batch, each as [`Backend::renew`] would,
    /// and answers one result per renewal, in order. The outer error means
    /// the batch as a whole got no answer (nothing is known of any lease).
    ///
    /// The default renews one lease after another; backends that can do it
    /// in one round trip override it and claim
    /// [`Capabilities::batch_renew`].
    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        let mut results = Vec::with_capacity(renewals.len());
        for renewal in renewals {
            results.push(self.renew(&renewal.lease, renewal.ttl).await);
        }
        Ok(results)
    }

    /// Removes `lease` only if it is current (I3) and wakes waiters;
    /// otherwise [`crate::Error::NotHeld`].
    async fn release(&self, lease: &LeaseId) -> Result<()>;

    /// The current unexpired lease on `key`, if any.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>>;

    /// Unexpired leases whose key starts with `prefix` (all when `None`),
    /// sorted by key.
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>>;

    /// Removes the current lease on `key` whoever holds it (an operator's tool)
    /// and wakes waiters. Returns the lease that was removed, if any.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>>;

    /// Releases every lease `owner` holds. Returns how many were removed.
    async fn release_all(&self, owner: &Owner) -> Result<u64>;

    /// Deletes expired lease records to reclaim space; never needed for
    /// correctness (I6) and never lowers a future token (I2).
    async fn cleanup_expired(&self) -> Result<u64>;

    /// Operator statistics.
    async fn stats(&self) -> Result<Stats>;

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
        Err(crate::Error::unsupported(self.name(), "watch"))
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
        Err(crate::Error::unsupported(self.name(), "set_data"))
    }

    /// Takes a reader's lease on `key` (`docs/rwlock.md`): granted while no
    /// unexpired exclusive lease and no unexpired writer intent (of any
    /// owner: tasks of one process share it) exists on `key`, whatever
    /// readers hold it, with a token drawn
    /// from the same per-key counter as [`Backend::try_acquire`] (I2 across
    /// both modes). Otherwise [`Acquire::Held`] with the writer, if any.
    /// Backends that offer it claim [`Capabilities::shared`]; the default
    /// answers [`crate::Error::Unsupported`].
    async fn try_acquire_shared(&self, request: &AcquireRequest) -> Result<Acquire> {
        let _ = request;
        Err(crate::Error::unsupported(self.name(), "shared locks"))
    }

    /// Extends the reader lease `lease`, as [`Backend::renew`] does for an
    /// exclusive one: only that exact (key, owner, token), unexpired (I3).
    async fn renew_shared(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let _ = (lease, ttl);
        Err(crate::Error::unsupported(self.name(), "shared locks"))
    }

    /// Extends a batch of reader leases, as [`Backend::renew_many`] does for
    /// exclusive ones. The default renews one after another.
    async fn renew_many_shared(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        let mut results = Vec::with_capacity(renewals.len());
        for renewal in renewals {
            results.push(self.renew_shared(&renewal.lease, renewal.ttl).await);
        }
        Ok(results)
    }

    /// Removes the reader lease `lease` only if it is current (I3) and wakes
    /// waiters; otherwise [`crate::Error::NotHeld`].
    async fn release_shared(&self, lease: &LeaseId) -> Result<()> {
        let _ = lease;
        Err(crate::Error::unsupported(self.name(), "shared locks"))
    }

    /// Records that `owner` waits to write `key` for the next `ttl` (backend
    /// clock): until it expires, is withdrawn or `owner` is granted `key`,
    /// new readers are refused, so that a stream of readers cannot starve a
    /// writer. An intent is a lease too: a writer that dies while waiting
    /// blocks readers for at most `ttl`. One intent per key; a later one
    /// replaces an expired one or one of the same owner, and leaves another
    /// owner's live intent in place (that writer is served first).
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        let _ = (key, owner, ttl);
        Err(crate::Error::unsupported(self.name(), "shared locks"))
    }

    /// Withdraws `owner`'s writer intent on `key`, if it has one (a writer
    /// that stopped waiting), and wakes waiting readers.
    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let _ = (key, owner);
        Err(crate::Error::unsupported(self.name(), "shared locks"))
    }

    /// Withdraws `owner`'s queue entry on `key`, if it has one: its waiting
    /// acquisition ended without a grant (deadline passed, or the wait was
    /// dropped). A grant removes the entry itself. Backends that claim
    /// [`Capabilities::fair`] implement it; the default has no queue and
    /// answers `Ok(())`.
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let _ = (key, owner);
        Ok(())
    }

    /// The live queue entries of `key`, oldest (next to be granted) first:
    /// each waiter's owner, the entry's position token and the time its
    /// entry has left (`expires_in`) on the backend's clock. The default has
    /// no queue and answers an empty list.
    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let _ = key;
        Ok(Vec::new())
    }
}
