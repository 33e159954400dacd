//! The operator's side of a backend: what `fencelock list`, `stats`,
//! `force-release` and `cleanup` call, and what the lock service's
//! dashboard shows.

use std::{collections::BTreeMap, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    error::Result,
    types::{LockInfo, LockKey, Owner},
};

/// Listing, statistics, force-release, release-all and cleanup: operations
/// a lock's holder and waiters never need, offered through
/// [`crate::Backend::admin`].
///
/// Each method is one atomic step on the backend, with its clock, as the
/// lease operations are.
#[async_trait]
pub trait BackendAdmin: Send + Sync {
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
