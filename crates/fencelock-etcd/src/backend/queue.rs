//! The waiters' queue (`docs/fairness.md`) on etcd.

use async_trait::async_trait;
use fencelock_core::{FairQueue, LockInfo, LockKey, Owner, Result};

use super::EtcdBackend;

#[async_trait]
impl FairQueue for EtcdBackend {
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.queue_leave(key, owner).await
    }

    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        self.queue_entries(key).await
    }
}
