//! Writer intents (`docs/rwlock.md`) on the lock service.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{Error, LockKey, Owner, Result, WriteIntents};
use reqwest::Method;

use super::{millis, HttpBackend};
use crate::wire::IntentBody;

#[async_trait]
impl WriteIntents for HttpBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        self.shared_only("write intents")?;
        let body = IntentBody {
            owner: owner.to_string(),
            ttl_ms: Some(millis(ttl)),
        };
        self.call_ok(Method::POST, self.lock_url(key, Some("intent")), &body)
            .await
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.shared_only("write intents")?;
        let body = IntentBody {
            owner: owner.to_string(),
            ttl_ms: None,
        };
        let mut url = self.lock_url(key, Some("intent"));
        url.path_segments_mut()
            .map_err(|()| Error::InvalidUrl("not a base URL".into()))?
            .push("withdraw");
        self.call_ok(Method::POST, url, &body).await
    }
}
