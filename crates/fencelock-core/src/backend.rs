//! The contract between the client and a storage engine (`docs/semantics.md`).

use std::{collections::BTreeMap, fmt, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{
    error::Result,
    types::{FencingToken, LockInfo, LockKey, Owner},
    wake::WakeSubscription,
};

/// A request for a lease, already validated by the client.
#[derive(Clone, Debug)]
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
}

/// A lease the backend granted or extended.
#[derive(Clone, Debug, PartialEq)]
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

/// What a backend can do beyond the required operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
}

/// Operator statistics about a backend's lock table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
/// The invariants each implementation must keep are I1–I6 of `docs/semantics.md`; the
/// conformance suite in `fencelock-testkit` checks them.
///
/// Implementations classify their failures as transient or permanent
/// ([`crate::BackendError`]) and report "not held" as [`crate::Error::NotHeld`].
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// Short name for logs and metrics: `memory`, `sqlite`, `postgres`, …
    fn name(&self) -> &'static str;

    /// What this backend offers beyond the required operations.
    fn capabilities(&self) -> Capabilities;

    /// Takes `key` if it is free or its lease has expired, drawing a new
    /// token greater than every token issued for `key` before (I1, I2, I6).
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire>;

    /// Extends the lease of (`owner`, `token`) to `ttl` from now, only if that
    /// exact lease is current and unexpired (I3). Otherwise
    /// [`crate::Error::NotHeld`]. A backend that cannot change a lease's
    /// length (an etcd keep-alive restores the length granted at acquire)
    /// reports the length it did extend by in [`Grant::ttl`].
    async fn renew(
        &self,
        key: &LockKey,
        owner: &Owner,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Grant>;

    /// Removes the lease only if (`owner`, `token`) hold it (I3) and wakes
    /// waiters. Returns whether a lease was removed.
    async fn release(&self, key: &LockKey, owner: &Owner, token: FencingToken) -> Result<bool>;

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
}
