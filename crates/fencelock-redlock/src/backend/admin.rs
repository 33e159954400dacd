//! The operator's calls on Redlock: listing, statistics, force-release and
//! cleanup.

use async_trait::async_trait;
use fencelock_core::{
    Backend, BackendAdmin, Error, LeaseId, LockInfo, LockKey, Owner, Result, Stats,
};

use super::RedlockBackend;

#[async_trait]
impl BackendAdmin for RedlockBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let answers = self
            .on_all(self.inner.options.plain_request(), |node| async move {
                node.list(prefix).await
            })
            .await;
        self.agreed(answers, "list")
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let answers = self
            .on_all(self.inner.options.plain_request(), |node| async move {
                Ok(node.force_release(key).await?.into_iter().collect())
            })
            .await;
        // What a majority held, else the newest lease any node held.
        let mut removed: Vec<LockInfo> = answers.iter().flatten().flatten().cloned().collect();
        removed.sort_by_key(|info| std::cmp::Reverse(info.token));
        let agreed = self.agreed(answers, "force-release")?;
        Ok(agreed
            .into_iter()
            .next()
            .or_else(|| removed.into_iter().next()))
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let mut released = 0;
        for lease in self
            .list(None)
            .await?
            .into_iter()
            .filter(|l| l.owner == *owner)
        {
            match self
                .release(&LeaseId::new(lease.key, owner.clone(), lease.token))
                .await
            {
                Ok(()) => released += 1,
                Err(Error::NotHeld { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // What a minority of nodes still holds for the owner (a grant that
        // failed to reach a majority and whose undo was lost) goes too.
        let _ = self
            .on_all(self.inner.options.plain_request(), |node| async move {
                node.release_all(owner).await
            })
            .await;
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        // Each node deletes expired leases itself; counters are kept on
        // purpose.
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats> {
        let leases = self.list(None).await?;
        let held_for = |info: &LockInfo| {
            // The node's "now" is `expires_at - expires_in`.
            let now =
                info.expires_at - chrono::Duration::from_std(info.expires_in).unwrap_or_default();
            (now - info.acquired_at).to_std().unwrap_or_default()
        };
        Ok(Stats::from_leases(
            leases.iter().map(|info| (info, held_for(info))),
            0,
        ))
    }
}
