//! [`MySqlFence`]: the fence table, standalone or inside the caller's own
//! transaction.

use std::fmt;

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencingToken, LockKey, Result};
use sqlx::{MySql, MySqlConnection};

use fencelock_sql_common::ConnectionPool;

use crate::options::MySqlOptions;

/// A fence kept in `<prefix>fences(resource, token BIGINT UNSIGNED)`
/// (`docs/semantics.md`, I7).
///
/// Use [`Fence::admit`] on its own (one short transaction), or
/// [`MySqlFence::admit_in`] inside the transaction of the protected write.
#[derive(Clone)]
pub struct MySqlFence {
    pool: ConnectionPool<MySql>,
    options: MySqlOptions,
    upsert: String,
    read: String,
    read_latest: String,
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
            upsert: format!(
                "INSERT INTO {fences} (resource, token) VALUES (?, ?)
                 ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))"
            ),
            read: format!("SELECT token FROM {fences} WHERE resource = ?"),
            // A locking read: it sees the latest committed row (which the
            // upsert has locked already), whereas a plain SELECT in a
            // REPEATABLE READ transaction that has read anything before
            // returns that transaction's snapshot. When the upsert changed
            // nothing (a newer token was stored after the snapshot), the
            // snapshot still holds the old, lower token and a stale token
            // would read back as admitted.
            read_latest: format!("SELECT token FROM {fences} WHERE resource = ? FOR UPDATE"),
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
        LockKey::new(resource)?;
        let current = self
            .options
            .bounded("admitting a token", self.admit_on(conn, resource, token))
            .await?;
        admission(current, token).into_result("mysql", resource, token)
    }

    /// The upsert and the read back; the token stored now.
    async fn admit_on(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        token: FencingToken,
    ) -> std::result::Result<u64, sqlx::Error> {
        sqlx::query(&self.upsert)
            .bind(resource)
            .bind(token.get())
            .execute(&mut *conn)
            .await?;
        sqlx::query_scalar(&self.read_latest)
            .bind(resource)
            .fetch_one(&mut *conn)
            .await
    }
}

fn admission(current: u64, token: FencingToken) -> Admission {
    if current == token.get() {
        Admission::Admitted
    } else {
        Admission::Stale {
            current: FencingToken(current),
        }
    }
}

#[async_trait]
impl Fence for MySqlFence {
    fn name(&self) -> &'static str {
        "mysql"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        let current = self
            .options
            .bounded("admitting a token", async {
                let mut s = self.pool.session().await?;
                let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                let current = self.admit_on(&mut tx, resource, token).await?;
                tx.commit().await?;
                s.finish();
                Ok(current)
            })
            .await?;
        Ok(admission(current, token))
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let current: Option<u64> = self
            .options
            .bounded("reading a fence", async {
                let mut s = self.pool.session().await?;
                let current = sqlx::query_scalar(&self.read)
                    .bind(resource)
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish_after(current)
            })
            .await?;
        Ok(current.map(FencingToken))
    }
}
