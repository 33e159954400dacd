//! The operator's calls on ZooKeeper: listing, statistics, force-release and
//! cleanup.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, LockInfo, LockKey, Owner, Result, Stats};
use zookeeper_client as zk;

use super::ZkBackend;
use crate::error::map;

#[async_trait]
impl BackendAdmin for ZkBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let (live, _) = self.scan(&c, prefix, now).await?;
        live.iter().map(|(key, node)| node.info(key, now)).collect()
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.free_key(key).await
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let (live, _) = self.scan(&c, None, now).await?;
        let mut released = 0;
        for (_, node) in live
            .iter()
            .filter(|(_, n)| !n.record.foreign && n.record.owner == owner.as_str())
        {
            // Unconditional: a renewal since the scan is still this owner's
            // lease (the path names one grant).
            match self.remove(&c, node, false).await {
                Ok(()) => released += 1,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map("releasing a lease", e)),
            }
        }
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let (_, expired) = self.scan(&c, None, now).await?;
        let mut removed = 0;
        for node in &expired {
            // Conditional: a lease renewed since the scan is live again.
            match self.remove(&c, node, true).await {
                Ok(()) => removed += 1,
                Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                Err(e) => return Err(map("deleting an expired lease", e)),
            }
        }
        if self.curator() {
            self.remove_orphans(&c).await?;
        }
        Ok(removed)
    }

    async fn stats(&self) -> Result<Stats> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let (live, expired) = self.scan(&c, None, now).await?;
        let infos = live
            .iter()
            .map(|(key, node)| node.info(key, now))
            .collect::<Result<Vec<_>>>()?;
        let held = infos.iter().zip(&live).map(|(info, (_, node))| {
            let ms = u64::try_from(now - node.stat.ctime).unwrap_or(0);
            (info, Duration::from_millis(ms))
        });
        Ok(Stats::from_leases(held, expired.len() as u64))
    }
}
