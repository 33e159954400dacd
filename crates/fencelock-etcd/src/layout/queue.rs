//! The waiters' queue (`docs/fairness.md`) on etcd's own lock layout.

use async_trait::async_trait;
use fencelock_core::{FairQueue, LeaseId, LockInfo, LockKey, Owner, Result};

use super::{decode, lock, token_of, EtcdLayoutBackend};

#[async_trait]
impl FairQueue for EtcdLayoutBackend {
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        if let Some(waiter) = self.take_waiter(key, owner) {
            self.revoke(waiter.lease.id).await;
        }
        // A wait dropped in the middle of an attempt took its waiter out of
        // the map for good: its key is found among the contenders (the
        // owner's keys that are not a grant held here).
        for kv in self.contenders(key).await? {
            let grant = LeaseId::new(key.clone(), owner.clone(), token_of(&kv));
            let waiting = decode(&kv).is_ok_and(|stored| stored.owner == *owner)
                && !lock(&self.grants).contains_key(&grant);
            if waiting {
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                if self.etcd.delete_grant(&full, token_of(&kv)).await? {
                    self.revoke(kv.lease()).await;
                }
            }
        }
        Ok(())
    }

    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let kvs = self.contenders(key).await?;
        let mut entries = Vec::new();
        for kv in kvs.iter().skip(1) {
            if let Some((info, _)) = self.info(key, kv).await? {
                entries.push(info);
            }
        }
        Ok(entries)
    }
}
