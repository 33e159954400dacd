//! The operator's calls on PostgreSQL: listing, statistics, force-release and
//! cleanup.

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, LockInfo, LockKey, Owner, Result, Stats};
use fencelock_sql_common::micros_to_duration;
use sqlx::Row;

use super::{lease, PostgresBackend};
use crate::error::map;

#[async_trait]
impl BackendAdmin for PostgresBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.options
            .bounded(
                "listing",
                self.pool
                    .fetch_all(sqlx::query(&self.sql.list).bind(prefix)),
            )
            .await?
            .iter()
            .map(lease)
            .collect()
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.options
            .bounded("force-releasing", async {
                let mut s = self.session().await?;
                let row = async {
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    sqlx::query(&self.sql.turn)
                        .bind(key.as_str())
                        .execute(&mut *tx)
                        .await?;
                    let row = sqlx::query(&self.sql.force_release)
                        .bind(key.as_str())
                        .fetch_optional(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(row)
                }
                .await;
                s.finish_after(row)
            })
            .await?
            .as_ref()
            .map(lease)
            .transpose()
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let released = self
            .options
            .bounded("releasing all", async {
                let mut s = self.session().await?;
                let released = async {
                    let writers = sqlx::query(&self.sql.release_all)
                        .bind(owner.as_str())
                        .fetch_all(s.conn()?)
                        .await?
                        .len();
                    // Readers under their keys' turns, so that each key's
                    // reader horizon is recomputed from a current view.
                    let keys: Vec<String> = sqlx::query_scalar(&self.sql.owner_reader_keys)
                        .bind(owner.as_str())
                        .fetch_all(s.conn()?)
                        .await?;
                    if keys.is_empty() {
                        return Ok(writers);
                    }
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    sqlx::query(&self.sql.lock_keys)
                        .bind(&keys)
                        .execute(&mut *tx)
                        .await?;
                    let readers = sqlx::query(&self.sql.release_all_readers)
                        .bind(owner.as_str())
                        .bind(&keys)
                        .fetch_all(&mut *tx)
                        .await?
                        .len();
                    tx.commit().await?;
                    Ok(writers + readers)
                }
                .await;
                s.finish_after(released)
            })
            .await?;
        Ok(released as u64)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let removed: i64 = self
            .options
            .bounded("cleaning up", async {
                let mut s = self.session().await?;
                let done = sqlx::query_scalar(&self.sql.cleanup)
                    .fetch_one(s.conn()?)
                    .await;
                s.finish_after(done)
            })
            .await?;
        Ok(u64::try_from(removed).unwrap_or(0))
    }

    async fn stats(&self) -> Result<Stats> {
        let rows = self
            .options
            .bounded(
                "computing stats",
                self.pool.fetch_all(sqlx::query(&self.sql.stats)),
            )
            .await?;
        let mut leases = Vec::with_capacity(rows.len());
        let mut expired = 0;
        for row in &rows {
            let count: Option<i64> = row.try_get("expired").map_err(|e| map("stats", e))?;
            match count {
                Some(n) => expired = u64::try_from(n).unwrap_or(0),
                None => {
                    let held: i64 = row.try_get("held_us").map_err(|e| map("stats", e))?;
                    leases.push((lease(row)?, micros_to_duration(held)));
                }
            }
        }
        Ok(Stats::from_leases(
            leases.iter().map(|(l, d)| (l, *d)),
            expired,
        ))
    }
}
