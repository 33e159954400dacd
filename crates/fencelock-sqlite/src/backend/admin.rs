//! The operator's calls on the SQLite lock table.

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, LockInfo, LockKey, LockMode, Owner, Result, Stats};
use rusqlite::named_params;

use super::{live_leases, SqliteBackend, LIVE, TABLES};
use crate::error;

#[async_trait]
impl BackendAdmin for SqliteBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let prefix = prefix.unwrap_or("").to_owned();
        self.read(move |conn, now| {
            live_leases(conn, now, &prefix)?
                .into_iter()
                .map(|l| l.into_info(now.us))
                .collect()
        })
        .await
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let k = key.clone();
        let removed = self
            .write(move |tx, now| {
                // The key is freed entirely: writer, readers and intent.
                let mut leases = live_leases(tx, now, k.as_str())?;
                leases.retain(|l| l.key == k.as_str());
                for table in ["fencelock_locks", "fencelock_readers", "fencelock_intents"] {
                    tx.execute(&format!("DELETE FROM {table} WHERE key = ?1"), [k.as_str()])
                        .map_err(error::map)?;
                }
                // The writer if any (it excludes readers), else the newest reader.
                let reported = match leases.iter().position(|l| l.mode == LockMode::Exclusive) {
                    Some(writer) => Some(leases.swap_remove(writer)),
                    None => leases.pop(),
                };
                reported.map(|l| l.into_info(now.us)).transpose()
            })
            .await?;
        if removed.is_some() {
            self.wakeups.notify(key.as_str());
        }
        Ok(removed)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let o = owner.clone();
        let released: Vec<String> = self
            .write(move |tx, now| {
                let mut keys = Vec::new();
                for table in TABLES {
                    let mut stmt = tx
                        .prepare(&format!(
                            "DELETE FROM {} WHERE owner = :owner AND {LIVE} RETURNING key",
                            table.name()
                        ))
                        .map_err(error::map)?;
                    let rows = stmt
                        .query_map(
                            named_params! {":owner": o.as_str(), ":boot": now.boot, ":now": now.us},
                            |r| r.get(0),
                        )
                        .map_err(error::map)?;
                    for key in rows {
                        keys.push(key.map_err(error::map)?);
                    }
                }
                tx.execute(
                    "DELETE FROM fencelock_intents WHERE owner = ?1",
                    [o.as_str()],
                )
                .map_err(error::map)?;
                Ok(keys)
            })
            .await?;
        for key in &released {
            self.wakeups.notify(key);
        }
        Ok(released.len() as u64)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        self.write(|tx, now| {
            let params = named_params! {":boot": now.boot, ":now": now.us};
            let mut removed = 0;
            for table in TABLES {
                removed += tx
                    .execute(
                        &format!("DELETE FROM {} WHERE NOT {LIVE}", table.name()),
                        params,
                    )
                    .map_err(error::map)?;
            }
            tx.execute(
                &format!("DELETE FROM fencelock_intents WHERE NOT {LIVE}"),
                params,
            )
            .map_err(error::map)?;
            Ok(removed as u64)
        })
        .await
    }

    async fn stats(&self) -> Result<Stats> {
        self.read(|conn, now| {
            let mut expired: i64 = 0;
            for table in TABLES {
                expired += conn
                    .query_row(
                        &format!("SELECT count(*) FROM {} WHERE NOT {LIVE}", table.name()),
                        named_params! {":boot": now.boot, ":now": now.us},
                        |r| r.get::<_, i64>(0),
                    )
                    .map_err(error::map)?;
            }
            let mut leases = Vec::new();
            for raw in live_leases(conn, now, "")? {
                let held_for = raw.held_for(now.us);
                leases.push((raw.into_info(now.us)?, held_for));
            }
            Ok(Stats::from_leases(
                leases.iter().map(|(info, held)| (info, *held)),
                u64::try_from(expired).unwrap_or(0),
            ))
        })
        .await
    }
}
