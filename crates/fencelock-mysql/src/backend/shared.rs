//! Read-write locks (`docs/rwlock.md`) on MySQL and MariaDB: the readers' leases and
//! the writer intents that hold new readers back.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Error, Grant, LeaseId, LockKey, Owner, Result, WriteIntents,
};
use fencelock_sql_common::{reader_answer, ttl_micros};
use sqlx::{MySqlConnection, Row};

use super::{draw_token, floor, lease, under_turn, MySqlBackend};

impl MySqlBackend {
    pub(super) async fn acquire_reader(&self, request: &AcquireRequest) -> Result<Acquire> {
        let key = request.key.as_str();
        let floor = floor(request)?;
        let (granted, row) = under_turn!(
            self,
            grant & request.key,
            "acquiring a read lock",
            key,
            |conn| {
                let gate = sqlx::query(&self.sql.gate)
                    .bind(key)
                    .fetch_optional(&mut *conn)
                    .await?;
                if let Some(row) = gate {
                    let live: Option<bool> = row.try_get("live")?;
                    let intent: Option<bool> = row.try_get("intent")?;
                    if live == Some(true) {
                        return Ok((false, Some(row)));
                    }
                    if intent == Some(true) {
                        return Ok((false, None));
                    }
                }
                draw_token(&mut *conn, &self.sql, floor).await?;
                sqlx::query(&self.sql.shared_insert)
                    .bind(key)
                    .bind(request.owner.as_str())
                    .bind(request.kind.as_deref())
                    .bind(request.data.as_ref())
                    .bind(ttl_micros(request.ttl))
                    .execute(&mut *conn)
                    .await?;
                let row = sqlx::query(&self.sql.shared_granted)
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await?;
                self.raise_horizon(conn, key, &request.owner, row.try_get("expires_at")?)
                    .await?;
                Ok((true, Some(row)))
            }
        )
        .await?;
        let info = row.as_ref().map(lease).transpose()?;
        Ok(reader_answer(granted, info, request.ttl))
    }

    pub(super) async fn renew_reader(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let key = lease.key.as_str();
        let expires_at = under_turn!(self, "renewing a read lock", key, |conn| {
            let matched = sqlx::query(&self.sql.shared_renew)
                .bind(ttl_micros(ttl))
                .bind(key)
                .bind(lease.owner.as_str())
                .bind(lease.token.get())
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if matched == 0 {
                return Ok(None);
            }
            let expires_at: sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc> =
                sqlx::query_scalar(&self.sql.shared_renewed)
                    .bind(key)
                    .bind(lease.token.get())
                    .fetch_one(&mut *conn)
                    .await?;
            self.raise_horizon(conn, key, &lease.owner, expires_at)
                .await?;
            Ok(Some(expires_at))
        })
        .await?
        .ok_or_else(|| Error::not_held(lease))?;
        Ok(Grant::new(lease.token, ttl, expires_at))
    }

    /// Moves the key's reader horizon to `expires_at`, the end of a
    /// reader's lease just granted or extended, if that is later.
    async fn raise_horizon(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        owner: &Owner,
        expires_at: sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>,
    ) -> std::result::Result<(), sqlx::Error> {
        sqlx::query(&self.sql.horizon)
            .bind(key)
            .bind(owner.as_str())
            .bind(expires_at)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    pub(super) async fn release_reader(&self, lease: &LeaseId) -> Result<()> {
        let key = lease.key.as_str();
        let released = under_turn!(self, "releasing a read lock", key, |conn| {
            let gone = sqlx::query(&self.sql.shared_release)
                .bind(key)
                .bind(lease.owner.as_str())
                .bind(lease.token.get())
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if gone > 0 {
                sqlx::query(&self.sql.recompute_horizon)
                    .bind(key)
                    .bind(key)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(gone > 0)
        })
        .await?;
        lease.found(released)
    }
}

#[async_trait]
impl WriteIntents for MySqlBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        self.options
            .bounded(
                "posting a writer's intent",
                self.pool.execute(
                    sqlx::query(&self.sql.post_intent)
                        .bind(key.as_str())
                        .bind(owner.as_str())
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
                self.pool.execute(
                    sqlx::query(&self.sql.withdraw_intent)
                        .bind(key.as_str())
                        .bind(owner.as_str()),
                ),
            )
            .await?;
        Ok(())
    }
}
