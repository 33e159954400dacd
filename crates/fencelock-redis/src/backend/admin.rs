//! The operator's calls on Redis: listing, statistics, force-release and
//! cleanup.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    Backend, BackendAdmin, Error, LeaseId, LockInfo, LockKey, Owner, Result, Stats,
};
use redis::Value;

use super::RedisBackend;
use crate::{
    error::map,
    node::{parse_describe, Call},
};

#[async_trait]
impl BackendAdmin for RedisBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        Ok(self
            .scan_leases(prefix)
            .await?
            .0
            .into_iter()
            .map(|(info, _)| info)
            .collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let row: Vec<Value> = Call::new(&self.inner.scripts.force_release, 4)
            .key(self.inner.keys.lease(key))
            .key(self.inner.keys.readers(key))
            .key(self.inner.keys.readers_info(key))
            .key(self.inner.keys.intent(key))
            .arg(self.inner.keys.channel(key.as_str()))
            .arg(key.as_str())
            .arg(self.inner.keys.changes())
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("force-release script", e))?;
        if row.len() == 1 {
            return Err(Error::InvalidArgument(format!(
                "{key} is held by another library's lock, which fencelock does not release; \
                 its holder carries no fencing token (docs/redis.md)"
            )));
        }
        parse_describe(key, &row)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let (leases, _) = self.scan_leases(None).await?;
        let mut released = 0;
        for (lease, _) in leases.into_iter().filter(|(l, _)| l.owner == *owner) {
            // Compare-and-delete per lease: one that changed hands since the
            // SCAN is left alone.
            let id = LeaseId::new(lease.key, owner.clone(), lease.token).with_mode(lease.mode);
            match self.release(&id).await {
                Ok(()) => released += 1,
                Err(Error::NotHeld { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        // Redis deletes expired keys itself; token counters are kept on
        // purpose (they are what keeps tokens growing).
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats> {
        let (leases, now_ms) = self.scan_leases(None).await?;
        let held_for = |acquired: i64| {
            Duration::from_millis(u64::try_from(now_ms.saturating_sub(acquired)).unwrap_or(0))
        };
        Ok(Stats::from_leases(
            leases.iter().map(|(info, acq)| (info, held_for(*acq))),
            0,
        ))
    }
}
