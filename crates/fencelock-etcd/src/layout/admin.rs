//! The operator's calls on etcd's own lock layout: listing, statistics, force-release and
//! cleanup.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use fencelock_core::{BackendAdmin, Error, LeaseId, LockInfo, LockKey, Owner, Result, Stats};

use super::{decode, hex, lock, token_of, EtcdLayoutBackend};

#[async_trait]
impl BackendAdmin for EtcdLayoutBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        Ok(self
            .holders(prefix)
            .await?
            .into_iter()
            .map(|(i, _)| i)
            .collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let kvs = self.contenders(key).await?;
        let Some(kv) = kvs.first() else {
            return Ok(None);
        };
        if decode(kv).is_err() {
            // A `concurrency` holder never reads its key again: deleting it
            // would leave that holder working beside the next one.
            return Err(Error::Unsupported(format!(
                "etcd backend: {key} is held by a client of etcd's concurrency package \
                 (lease {}), which would not notice a force-release; end it there, or \
                 revoke its lease (etcdctl lease revoke {})",
                hex(kv.lease()),
                hex(kv.lease()),
            )));
        }
        let info = self.info(key, kv).await?;
        let full = String::from_utf8_lossy(kv.key()).into_owned();
        if info.is_some() && self.etcd.delete_grant(&full, token_of(kv)).await? {
            return Ok(info.map(|(i, _)| i));
        }
        Ok(None)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let mut released = 0;
        for (key, kvs) in self.scan(None).await? {
            for kv in kvs {
                if !decode(&kv).is_ok_and(|stored| stored.owner == *owner) {
                    continue;
                }
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                if self.etcd.delete_grant(&full, token_of(&kv)).await? {
                    lock(&self.grants).remove(&LeaseId::new(
                        key.clone(),
                        owner.clone(),
                        token_of(&kv),
                    ));
                    self.revoke(kv.lease()).await;
                    released += 1;
                }
            }
        }
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        // etcd deletes a key when its lease expires.
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats> {
        let holders = self.holders(None).await?;
        let now = Utc::now().timestamp_millis();
        let held = |acq: i64| Duration::from_millis(u64::try_from(now - acq).unwrap_or(0));
        Ok(Stats::from_leases(
            holders.iter().map(|(i, acq)| (i, held(*acq))),
            0,
        ))
    }
}
