//! The operator's calls on MySQL and MariaDB: listing, statistics, force-release and
//! cleanup.

use async_trait::async_trait;
use fencelock_core::{BackendAdmin, LockInfo, LockKey, Owner, Result, Stats};

use super::{lease, stats_rows, under_turn, MySqlBackend};
use crate::error::bad_reply;

#[async_trait]
impl BackendAdmin for MySqlBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let mut leases = Vec::new();
        for sql in [&self.sql.list, &self.sql.list_readers] {
            let rows = self
                .options
                .bounded(
                    "listing",
                    self.pool
                        .fetch_all(sqlx::query(sql).bind(prefix).bind(prefix).bind(prefix)),
                )
                .await?;
            for row in &rows {
                leases.push(lease(row)?);
            }
        }
        leases.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
        Ok(leases)
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let k = key.as_str();
        let forced = under_turn!(self, "force-releasing", k, |conn| {
            // The key is freed entirely; the answer is the writer,
            // else the newest reader.
            let writer = sqlx::query(&self.sql.inspect)
                .bind(k)
                .fetch_optional(&mut *conn)
                .await?;
            let reader = sqlx::query(&self.sql.last_reader)
                .bind(k)
                .fetch_optional(&mut *conn)
                .await?;
            for sql in [&self.sql.force_delete, &self.sql.force_delete_readers] {
                sqlx::query(sql).bind(k).execute(&mut *conn).await?;
            }
            Ok(writer.or(reader))
        })
        .await?;
        forced.as_ref().map(lease).transpose()
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let writers = self
            .options
            .bounded(
                "releasing all",
                self.pool
                    .execute(sqlx::query(&self.sql.release_all).bind(owner.as_str())),
            )
            .await?;
        let keys: Vec<Vec<u8>> = self
            .options
            .bounded("releasing all", async {
                let mut s = self.session().await?;
                let keys = sqlx::query_scalar(&self.sql.owner_reader_keys)
                    .bind(owner.as_str())
                    .fetch_all(s.conn()?)
                    .await;
                s.finish_after(keys)
            })
            .await?;
        let mut readers = 0;
        // One key's turn at a time: its horizon is recomputed from a
        // current view, as a reader's release does.
        for key in keys {
            let key = String::from_utf8(key).map_err(|_| bad_reply("a key is not UTF-8"))?;
            let k = key.as_str();
            readers += under_turn!(self, "releasing all", k, |conn| {
                let gone = sqlx::query(&self.sql.release_owner_readers)
                    .bind(k)
                    .bind(owner.as_str())
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                sqlx::query(&self.sql.recompute_horizon)
                    .bind(k)
                    .bind(k)
                    .execute(&mut *conn)
                    .await?;
                Ok(gone)
            })
            .await?;
        }
        Ok(writers + readers)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let mut removed = 0;
        for sql in [&self.sql.cleanup, &self.sql.cleanup_readers] {
            removed += self
                .options
                .bounded("cleaning up", self.pool.execute(sqlx::query(sql)))
                .await?;
        }
        Ok(removed)
    }

    async fn stats(&self) -> Result<Stats> {
        let rows = self
            .options
            .bounded(
                "computing stats",
                self.pool.fetch_all(sqlx::query(&self.sql.stats)),
            )
            .await?;
        let (mut leases, expired) = stats_rows(&rows)?;
        let rows = self
            .options
            .bounded(
                "computing stats",
                self.pool.fetch_all(sqlx::query(&self.sql.stats_readers)),
            )
            .await?;
        let (readers, expired_readers) = stats_rows(&rows)?;
        leases.extend(readers);
        Ok(Stats::from_leases(
            leases.iter().map(|(l, d)| (l, *d)),
            expired + expired_readers,
        ))
    }
}
