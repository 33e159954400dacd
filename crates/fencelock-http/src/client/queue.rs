//! The waiters' queue (`docs/fairness.md`) on the lock service.

use async_trait::async_trait;
use fencelock_core::{Error, FairQueue, LockInfo, LockKey, Owner, Result};
use reqwest::{Method, StatusCode};

use super::{refused, HttpBackend};
use crate::wire::{LockList, QueueLeaveBody};

#[async_trait]
impl FairQueue for HttpBackend {
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        if !self.capabilities.fair {
            return Ok(());
        }
        let body = QueueLeaveBody {
            owner: owner.to_string(),
        };
        let mut url = self.lock_url(key, Some("queue"));
        url.path_segments_mut()
            .map_err(|()| Error::InvalidUrl("not a base URL".into()))?
            .push("leave");
        self.call_ok(Method::POST, url, &body).await
    }

    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        if !self.capabilities.fair {
            return Ok(Vec::new());
        }
        let list: LockList = self
            .conn
            .json(
                Method::GET,
                self.lock_url(key, Some("queue")),
                None::<&()>,
                &[],
            )
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        Ok(list.locks.into_iter().map(|l| l.info).collect())
    }
}
