//! The operator's calls on a sharded map: listing, statistics, force-release and
//! cleanup.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, Error, LockInfo, LockKey, Owner, Result, Stats};

use super::{merged, Route, ShardedBackend};
use crate::epoch;

#[async_trait]
impl BackendAdmin for ShardedBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.check_all(Duration::ZERO).await?;
        self.leases(prefix).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        match self.checked_route(key, Duration::ZERO).await? {
            Route::One(i) => self.backends[i].administer()?.force_release(key).await,
            Route::Two {
                authority,
                follower,
            } => {
                let first = self.backends[authority]
                    .administer()?
                    .force_release(key)
                    .await?;
                let second = self.backends[follower]
                    .administer()?
                    .force_release(key)
                    .await?;
                Ok(merged(first, second))
            }
        }
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        if epoch::is_reserved(owner.as_str()) {
            return Err(Error::InvalidOwner(format!(
                "owners starting with {:?} are reserved by the sharded backend",
                epoch::RESERVED_PREFIX
            )));
        }
        self.check_all(Duration::ZERO).await?;
        // During a transition a moving key is held on two shards: the
        // answer counts it once, as `list` shows it.
        let counted = match self.phase {
            Some(_) => Some(
                self.leases(None)
                    .await?
                    .iter()
                    .filter(|l| &l.owner == owner)
                    .count() as u64,
            ),
            None => None,
        };
        let mut removed = 0;
        for backend in &self.backends {
            removed += backend.administer()?.release_all(owner).await?;
        }
        Ok(counted.map_or(removed, |c| c.min(removed)))
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        self.check_all(Duration::ZERO).await?;
        let mut removed = 0;
        for backend in &self.backends {
            removed += backend.administer()?.cleanup_expired().await?;
        }
        Ok(removed)
    }

    async fn stats(&self) -> Result<Stats> {
        self.check_all(Duration::ZERO).await?;
        let mut expired = 0;
        for backend in &self.backends {
            expired += backend.administer()?.stats().await?.expired_not_cleaned;
        }
        let leases = self.leases(None).await?;
        // Hold times on each shard's own clock: its "now" is the lease's
        // end minus what remains of it.
        let held = leases.iter().map(|l| {
            let lived = l
                .expires_at
                .signed_duration_since(l.acquired_at)
                .to_std()
                .unwrap_or_default();
            (l, lived.saturating_sub(l.expires_in))
        });
        Ok(Stats::from_leases(held, expired))
    }
}
