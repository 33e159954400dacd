//! [`MySqlFence`]: the fence table, standalone or inside the caller's own
//! transaction.

use std::fmt;

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencedValue, FencingToken, LockKey, LockMode, Result};
use sqlx::{MySql, MySqlConnection};

use fencelock_sql_common::{ConnectionPool, FenceReset};

use crate::{error::retry_deadlocks, options::MySqlOptions};

/// A fence kept in `<prefix>fences(resource, token BIGINT UNSIGNED)`
/// (`docs/semantics.md`, I7), with its fenced values in
/// `<prefix>fence_values(resource, token, value MEDIUMBLOB)`, written in the
/// admission's transaction.
///
/// Use [`Fence::admit`] on its own (one short transaction), or
/// [`MySqlFence::admit_in`] inside the transaction of the protected write.
#[derive(Clone)]
pub struct MySqlFence {
    pool: ConnectionPool<MySql>,
    options: MySqlOptions,
    upsert: String,
    upsert_reader: String,
    read: String,
    read_writer: String,
    read_latest: String,
    read_latest_writer: String,
    store_value: String,
    read_value: String,
    reset: FenceReset,
}

impl fmt::Debug for MySqlFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlFence").finish_non_exhaustive()
    }
}

impl MySqlFence {
    /// Connects with the options of `url` and creates the schema if needed.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(MySqlOptions::from_url(url)?).await
    }

    /// Connects with parsed options.
    pub async fn connect_with(options: MySqlOptions) -> Result<Self> {
        let pool = options.open().await?;
        let names = options.names();
        let fences = &names.fences;
        Ok(Self {
            pool,
            options,
            // Always storing max(stored, presented); the read that follows in
            // the same transaction shows the presented token exactly when it
            // was admitted.
            // A writer's admission also becomes the highest writer token
            // (assigned first: it tests the old `token`).
            upsert: format!(
                "INSERT INTO {fences} (resource, token, writer_token) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE
                   writer_token = IF(VALUES(token) >= token, VALUES(token), writer_token),
                   token = GREATEST(token, VALUES(token))"
            ),
            // A reader's is decided against the highest writer token (NULL in
            // a row from before read-write locks, whose token was a
            // writer's; 0 for none yet), made explicit first; reading it
            // back shows whether the reader reached it.
            upsert_reader: format!(
                "INSERT INTO {fences} (resource, token, writer_token) VALUES (?, ?, 0)
                 ON DUPLICATE KEY UPDATE
                   writer_token = COALESCE(writer_token, token),
                   token = IF(VALUES(token) >= writer_token, GREATEST(token, VALUES(token)), token)"
            ),
            read: format!("SELECT token FROM {fences} WHERE resource = ?"),
            read_writer: format!(
                "SELECT COALESCE(writer_token, token) FROM {fences} WHERE resource = ?"
            ),
            read_latest_writer: format!(
                "SELECT writer_token FROM {fences} WHERE resource = ? FOR UPDATE"
            ),
            // A locking read: it sees the latest committed row (which the
            // upsert has locked already), whereas a plain SELECT in a
            // REPEATABLE READ transaction that has read anything before
            // returns that transaction's snapshot. When the upsert changed
            // nothing (a newer token was stored after the snapshot), the
            // snapshot still holds the old, lower token and a stale token
            // would read back as admitted.
            read_latest: format!("SELECT token FROM {fences} WHERE resource = ? FOR UPDATE"),
            store_value: format!(
                "INSERT INTO {values} (resource, token, value) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE token = VALUES(token), value = VALUES(value)",
                values = names.fence_values
            ),
            read_value: format!(
                "SELECT token, value FROM {} WHERE resource = ?",
                names.fence_values
            ),
            reset: FenceReset::new(fences, &names.fence_values, "?", "token"),
        })
    }

    /// Admits `token` for `resource` on `conn`, which must be inside a
    /// transaction (typically `&mut *tx` of the caller's own): the admission
    /// commits or rolls back with the protected write, and the fence row
    /// stays locked until then.
    ///
    /// For a fenced column in your own table, the same rule is one
    /// statement: `UPDATE t SET …, fence = ? WHERE id = ? AND fence <= ?`,
    /// where 0 affected rows means a newer holder wrote (the driver reports
    /// matched rows, so an unchanged row still counts as 1).
    ///
    /// Like every statement of the library, the admission gives up after
    /// the URL's `op_timeout` with a transient error. The connection is then
    /// in the middle of a statement: abandon (drop) the transaction rather
    /// than use it further.
    pub async fn admit_in(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<()> {
        self.admit_shared_in(conn, resource, token, LockMode::Exclusive)
            .await
    }

    /// Admits `token` of a lease held in `mode` (a read-write lock's reader
    /// or writer, see [`Fence::admit_shared`]) on `conn`, as
    /// [`MySqlFence::admit_in`] does.
    pub async fn admit_shared_in(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<()> {
        LockKey::new(resource)?;
        let current = self
            .options
            .bounded(
                "admitting a token",
                self.admit_on(conn, resource, token, mode),
            )
            .await?;
        admission(current, token, mode).into_result("mysql", resource, token)
    }

    /// The upsert and the read back: for a writer the token stored now, for
    /// a reader the highest writer token (0: none).
    async fn admit_on(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> std::result::Result<u64, sqlx::Error> {
        let (upsert, read) = match mode {
            LockMode::Exclusive => (&self.upsert, &self.read_latest),
            LockMode::Shared => (&self.upsert_reader, &self.read_latest_writer),
        };
        let query = sqlx::query(upsert).bind(resource).bind(token.get());
        let query = match mode {
            LockMode::Exclusive => query.bind(token.get()),
            LockMode::Shared => query,
        };
        query.execute(&mut *conn).await?;
        sqlx::query_scalar(read)
            .bind(resource)
            .fetch_one(&mut *conn)
            .await
    }
}

/// A MySQL read-back is never NULL: a reader's is 0 when no writer was
/// admitted yet, which every token reaches.
fn admission(current: u64, token: FencingToken, mode: LockMode) -> Admission {
    fencelock_sql_common::admission(Some(FencingToken(current)), token, mode)
}

impl MySqlFence {
    /// A stored token, or none for a missing row (or, with `zero_is_none`,
    /// the 0 of "no writer yet").
    async fn read_token(
        &self,
        sql: &str,
        resource: &str,
        zero_is_none: bool,
    ) -> Result<Option<FencingToken>> {
        let current: Option<u64> = self
            .options
            .bounded(
                "reading a fence",
                self.pool
                    .fetch_optional_scalar(sqlx::query_scalar(sql).bind(resource)),
            )
            .await?;
        Ok(current
            .filter(|t| !(zero_is_none && *t == 0))
            .map(FencingToken))
    }
}

#[async_trait]
impl Fence for MySqlFence {
    fn name(&self) -> &'static str {
        "mysql"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        self.read_token(&self.read, resource, false).await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let current = self
            .options
            .bounded("admitting a token", async {
                let mut s = self.pool.session().await?;
                let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                let current = self.admit_on(&mut tx, resource, token, mode).await?;
                tx.commit().await?;
                s.finish();
                Ok(current)
            })
            .await?;
        Ok(admission(current, token, mode))
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        self.read_token(&self.read_writer, resource, true).await
    }

    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        let mode = LockMode::Exclusive;
        let current = self
            .options
            .bounded(
                "writing a value",
                // Against a reset taking the rows in the other order.
                retry_deadlocks(move || async move {
                    let mut s = self.pool.session().await?;
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    let current = self.admit_on(&mut tx, resource, token, mode).await?;
                    // The fence row stays locked until the commit, so no
                    // lower token's value can land after this one.
                    if admission(current, token, mode) == Admission::Admitted {
                        sqlx::query(&self.store_value)
                            .bind(resource)
                            .bind(token.get())
                            .bind(value)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    s.finish();
                    Ok(current)
                }),
            )
            .await?;
        Ok(admission(current, token, mode))
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let row: Option<(u64, Vec<u8>)> = self
            .options
            .bounded(
                "reading a value",
                self.pool
                    .fetch_optional_as(sqlx::query_as(&self.read_value).bind(resource)),
            )
            .await?;
        Ok(row.map(|(token, value)| FencedValue::new(FencingToken(token), value)))
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let had: Option<u64> = self
            .options
            .bounded("resetting a fence", async {
                let mut s = self.pool.session().await?;
                let had = self.reset.run::<MySql, _>(s.conn()?, resource).await;
                s.finish_after(had)
            })
            .await?;
        Ok(had.map(FencingToken))
    }
}
