//! The operator's calls on the lock service: listing, statistics, force-release and
//! cleanup.

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, LockInfo, LockKey, Owner, Result, Stats};
use reqwest::{Method, StatusCode};

use super::{refused, HttpBackend};
use crate::wire::{LockBody, LockList};

#[async_trait]
impl BackendAdmin for HttpBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let mut url = self.conn.url(&["v1", "locks"]);
        if let Some(prefix) = prefix {
            url.query_pairs_mut().append_pair("prefix", prefix);
        }
        let list: LockList = self
            .conn
            .json(Method::GET, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        Ok(list.locks.into_iter().map(|l| l.info).collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        #[derive(serde::Deserialize)]
        struct Removed {
            removed: LockBody,
        }
        let url = self.lock_url(key, None);
        Ok(self
            .conn
            .json::<Removed>(Method::DELETE, url, None::<&()>, &[StatusCode::NOT_FOUND])
            .await?
            .ok()
            .map(|r| r.removed.info))
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        #[derive(serde::Deserialize)]
        struct Released {
            released: u64,
        }
        let url = self.conn.url(&["v1", "owners", owner.as_str(), "release"]);
        let r: Released = self
            .conn
            .json(Method::POST, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        Ok(r.released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        #[derive(serde::Deserialize)]
        struct Cleaned {
            deleted: u64,
        }
        let url = self.conn.url(&["v1", "cleanup"]);
        let r: Cleaned = self
            .conn
            .json(Method::POST, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        Ok(r.deleted)
    }

    async fn stats(&self) -> Result<Stats> {
        let url = self.conn.url(&["v1", "stats"]);
        self.conn
            .json(Method::GET, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))
    }
}
