//! Read-write locks (`docs/rwlock.md`) on PostgreSQL: the readers' leases and
//! the writer intents that hold new readers back.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Error, Grant, LeaseId, LockKey, Owner, Renewal, Result, WriteIntents,
};
use fencelock_sql_common::{reader_answer, ttl_micros};

use super::{batch_columns, data_text, db_token, floor, lease, PostgresBackend};
use crate::error::{bad_reply, map};

impl PostgresBackend {
    pub(super) async fn acquire_reader(&self, request: &AcquireRequest) -> Result<Acquire> {
        let floor = floor(request)?;
        let key = request.key.as_str();
        let (held, row) = self
            .options
            .granting("acquiring a read lock", &request.key, async {
                let mut s = self.session().await?;
                let answer = async {
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    if let Some(floor) = floor {
                        self.raise_floor(&mut tx, floor).await?;
                    }
                    sqlx::query(&self.sql.turn)
                        .bind(key)
                        .execute(&mut *tx)
                        .await?;
                    let passed = sqlx::query(&self.sql.shared_gate)
                        .bind(key)
                        .bind(request.owner.as_str())
                        .bind(ttl_micros(request.ttl))
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some();
                    let answer = if passed {
                        let row = sqlx::query(&self.sql.shared_insert)
                            .bind(key)
                            .bind(request.owner.as_str())
                            .bind(request.kind.as_deref())
                            .bind(data_text(request.data.as_ref()))
                            .bind(ttl_micros(request.ttl))
                            .fetch_one(&mut *tx)
                            .await?;
                        (false, Some(row))
                    } else {
                        let writer = sqlx::query(&self.sql.writer)
                            .bind(key)
                            .fetch_optional(&mut *tx)
                            .await?;
                        (true, writer)
                    };
                    tx.commit().await?;
                    Ok(answer)
                }
                .await;
                s.finish_after(answer)
            })
            .await?;
        let info = row.as_ref().map(lease).transpose()?;
        Ok(reader_answer(!held, info, request.ttl))
    }

    pub(super) async fn renew_readers(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let (keys, owners, tokens, ttls) = batch_columns(renewals);
        let rows = self
            .options
            .bounded("renewing read locks", async {
                let mut s = self.session().await?;
                let rows = async {
                    // Under the keys' turns: a release recomputing a key's
                    // reader horizon never overwrites this extension of it.
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    sqlx::query(&self.sql.lock_keys)
                        .bind(&keys)
                        .execute(&mut *tx)
                        .await?;
                    let rows = sqlx::query(&self.sql.renew_many_shared)
                        .bind(&keys)
                        .bind(&owners)
                        .bind(&tokens)
                        .bind(&ttls)
                        .fetch_all(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(rows)
                }
                .await;
                s.finish_after(rows)
            })
            .await?;
        fencelock_sql_common::renewal_answers(
            renewals,
            &rows,
            |e| map("renewing read locks", e),
            bad_reply,
        )
    }

    pub(super) async fn release_reader(&self, lease: &LeaseId) -> Result<()> {
        let Some(db_token) = db_token(lease.token) else {
            return Err(Error::not_held(lease));
        };
        let key = lease.key.as_str();
        let rows = self
            .options
            .bounded("releasing a read lock", async {
                let mut s = self.session().await?;
                let rows = async {
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    sqlx::query(&self.sql.turn)
                        .bind(key)
                        .execute(&mut *tx)
                        .await?;
                    let rows = sqlx::query(&self.sql.release_shared)
                        .bind(key)
                        .bind(lease.owner.as_str())
                        .bind(db_token)
                        .fetch_all(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(rows)
                }
                .await;
                s.finish_after(rows)
            })
            .await?;
        lease.found(!rows.is_empty())
    }
}

#[async_trait]
impl WriteIntents for PostgresBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        self.options
            .bounded(
                "posting a writer's intent",
                self.pool.execute(
                    sqlx::query(&self.sql.post_intent)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(ttl_micros(ttl)),
                ),
            )
            .await?;
        Ok(())
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.options
            .bounded(
                "withdrawing a writer's intent",
                self.pool.fetch_all(
                    sqlx::query(&self.sql.withdraw_intent)
                        .bind(key.as_str())
                        .bind(owner.as_str()),
                ),
            )
            .await?;
        Ok(())
    }
}
