//! Writer intents (`docs/rwlock.md`) on Redis: what holds new readers back
//! while a writer waits. Readers' leases go through the same operations as
//! writers', with their own keys and scripts (`backend.rs`).

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{LockKey, Owner, Result, WriteIntents};

use super::RedisBackend;
use crate::{
    error::map,
    node::{ttl_ms, Call},
};

#[async_trait]
impl WriteIntents for RedisBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        self.readers_allowed()?;
        let _: i64 = Call::new(&self.inner.scripts.post_intent, 1)
            .key(self.inner.keys.intent(key))
            .arg(owner.as_str())
            .arg(ttl_ms(ttl))
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("intent script", e))?;
        Ok(())
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.readers_allowed()?;
        let _: i64 = Call::new(&self.inner.scripts.withdraw_intent, 1)
            .key(self.inner.keys.intent(key))
            .arg(owner.as_str())
            .arg(self.inner.keys.channel(key.as_str()))
            .arg(key.as_str())
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("intent script", e))?;
        Ok(())
    }
}
