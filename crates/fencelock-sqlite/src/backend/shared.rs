//! Writer intents, the part of a read-write lock (`docs/rwlock.md`) beyond
//! the readers' own rows in `fencelock_readers`.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{LockKey, Owner, Result, WriteIntents};
use rusqlite::named_params;

use super::{ttl_us, SqliteBackend, LIVE};
use crate::error;

#[async_trait]
impl WriteIntents for SqliteBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        let (key, owner) = (key.clone(), owner.clone());
        self.write(move |tx, now| {
            // Unqualified columns in the DO UPDATE's WHERE are the stored
            // intent's: it is replaced only when it is this owner's or dead.
            tx.execute(
                &format!(
                    "INSERT INTO fencelock_intents (key, owner, boot_id, renewed_mono_us, \
                         expires_mono_us) VALUES (:key, :owner, :boot, :now, :now + :ttl) \
                     ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, \
                         boot_id = excluded.boot_id, renewed_mono_us = excluded.renewed_mono_us, \
                         expires_mono_us = excluded.expires_mono_us \
                     WHERE owner = excluded.owner OR NOT {LIVE}"
                ),
                named_params! {
                    ":key": key.as_str(), ":owner": owner.as_str(), ":boot": now.boot,
                    ":now": now.us, ":ttl": ttl_us(ttl),
                },
            )
            .map_err(error::map)?;
            Ok(())
        })
        .await
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let (k, o) = (key.clone(), owner.clone());
        let withdrawn = self
            .write(move |tx, _| {
                tx.execute(
                    "DELETE FROM fencelock_intents WHERE key = ?1 AND owner = ?2",
                    [k.as_str(), o.as_str()],
                )
                .map_err(error::map)
            })
            .await?;
        if withdrawn > 0 {
            self.wakeups.notify(key.as_str());
        }
        Ok(())
    }
}
