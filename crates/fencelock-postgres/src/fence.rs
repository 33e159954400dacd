//! [`PostgresFence`]: the fence table, standalone or inside the caller's own
//! transaction.

use std::fmt;

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencedValue, FencingToken, LockKey, LockMode, Result};
use fencelock_sql_common::{ConnectionPool, FenceReset};
use sqlx::{PgConnection, Postgres};

use crate::{error::bad_reply, options::PostgresOptions};

/// A fence kept in `<prefix>fences(resource, token)` (`docs/semantics.md`, I7),
/// with its fenced values in `<prefix>fence_values(resource, token, value)`,
/// written in the admission's transaction.
///
/// Tokens are stored as `numeric(20,0)`, not `bigint`: the backend never
/// issues a token above `i64::MAX`, but a fence also guards tokens from other
/// backends and must admit any `u64`.
///
/// Use [`Fence::admit`] on its own, or [`PostgresFence::admit_in`] inside the
/// transaction that performs the protected write, so that the admission and
/// the write commit (or roll back) together.
#[derive(Clone)]
pub struct PostgresFence {
    pool: ConnectionPool<Postgres>,
    options: PostgresOptions,
    admit_sql: String,
    admit_reader_sql: String,
    highest_sql: String,
    highest_writer_sql: String,
    store_value_sql: String,
    read_value_sql: String,
    reset: FenceReset,
}

impl fmt::Debug for PostgresFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresFence").finish_non_exhaustive()
    }
}

impl PostgresFence {
    /// Connects with the options of `url` (the same URL as the backend's)
    /// and creates the schema if needed.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(PostgresOptions::from_url(url)?).await
    }

    /// Connects with parsed options. The fence's own pool always commits
    /// synchronously, whatever the lock statements use: a lost admission
    /// would let a stale writer back in.
    pub async fn connect_with(options: PostgresOptions) -> Result<Self> {
        let pool = options.open(false).await?;
        let names = options.names();
        let fences = &names.fences;
        Ok(Self {
            pool,
            options,
            // Always writing max(stored, presented) makes one statement both
            // decide and report: RETURNING shows the presented token exactly
            // when it was admitted. Tokens travel as text because sqlx has no
            // u64 <-> numeric mapping without extra crates.
            // A writer's admission also becomes the highest writer token.
            admit_sql: format!(
                "INSERT INTO {fences} AS f (resource, token, writer_token)
                 VALUES ($1, $2::numeric, $2::numeric)
                 ON CONFLICT (resource) DO UPDATE SET
                   token = GREATEST(f.token, EXCLUDED.token),
                   writer_token = CASE WHEN EXCLUDED.token >= f.token THEN EXCLUDED.token
                                       ELSE f.writer_token END
                 RETURNING token::text"
            ),
            // A reader's is decided against the highest writer token (NULL:
            // a row from before read-write locks, whose token was a
            // writer's; -1: no writer yet), which it returns: the reader
            // was admitted iff that is not above its token. The row keeps
            // its writer token explicitly from then on.
            admit_reader_sql: format!(
                "INSERT INTO {fences} AS f (resource, token, writer_token)
                 VALUES ($1, $2::numeric, -1)
                 ON CONFLICT (resource) DO UPDATE SET
                   token = CASE WHEN EXCLUDED.token >= COALESCE(f.writer_token, f.token)
                                THEN GREATEST(f.token, EXCLUDED.token) ELSE f.token END,
                   writer_token = COALESCE(f.writer_token, f.token)
                 RETURNING writer_token::text"
            ),
            highest_sql: format!("SELECT token::text FROM {fences} WHERE resource = $1"),
            highest_writer_sql: format!(
                "SELECT COALESCE(writer_token, token)::text FROM {fences} WHERE resource = $1"
            ),
            store_value_sql: format!(
                "INSERT INTO {values} (resource, token, value) VALUES ($1, $2::numeric, $3)
                 ON CONFLICT (resource) DO UPDATE SET
                   token = EXCLUDED.token, value = EXCLUDED.value",
                values = names.fence_values
            ),
            read_value_sql: format!(
                "SELECT token::text, value FROM {} WHERE resource = $1",
                names.fence_values
            ),
            reset: FenceReset::new(fences, &names.fence_values, "$1", "token::text"),
        })
    }

    /// Admits `token` for `resource` on `conn`, typically `&mut *tx` of the
    /// caller's own transaction: the admission becomes visible only when
    /// that transaction commits, and vanishes if it rolls back. The row stays
    /// locked until then, so concurrent admissions for the same resource
    /// wait for the transaction to end.
    ///
    /// Like every statement of the library, the admission gives up after
    /// the URL's `op_timeout` with a transient error. The connection is then
    /// in the middle of a statement: abandon (drop) the transaction rather
    /// than use it further.
    ///
    /// For a fenced column in your own table, the same rule is one
    /// statement: `UPDATE t SET …, fence = $token WHERE id = $id AND fence
    /// <= $token`, where 0 affected rows means a newer holder wrote.
    pub async fn admit_in(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<()> {
        self.admit_shared_in(conn, resource, token, LockMode::Exclusive)
            .await
    }

    /// Admits `token` of a lease held in `mode` (a read-write lock's reader
    /// or writer, see [`Fence::admit_shared`]) on `conn`, as
    /// [`PostgresFence::admit_in`] does.
    pub async fn admit_shared_in(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<()> {
        LockKey::new(resource)?;
        self.options
            .bounded(
                "admitting a token",
                admit(conn, self.admit_sql(mode), resource, token),
            )
            .await
            .and_then(|stored| admission(&stored, token, mode))?
            .into_result("postgres", resource, token)
    }

    fn admit_sql(&self, mode: LockMode) -> &str {
        match mode {
            LockMode::Exclusive => &self.admit_sql,
            LockMode::Shared => &self.admit_reader_sql,
        }
    }

    /// A stored token, or none for the -1 of "no writer yet".
    async fn read_token(&self, sql: &str, resource: &str) -> Result<Option<FencingToken>> {
        let stored: Option<String> = self
            .options
            .bounded(
                "reading a fence",
                self.pool
                    .fetch_optional_scalar(sqlx::query_scalar(sql).bind(resource)),
            )
            .await?;
        stored
            .filter(|t| !t.starts_with('-'))
            .as_deref()
            .map(parse_token)
            .transpose()
    }
}

fn parse_token(text: &str) -> Result<FencingToken> {
    text.parse::<u64>()
        .map(FencingToken)
        .map_err(|_| bad_reply(format!("fence token {text:?} is not a u64")))
}

/// The upsert; the token it stored, as text.
async fn admit(
    conn: &mut PgConnection,
    sql: &str,
    resource: &str,
    token: FencingToken,
) -> std::result::Result<String, sqlx::Error> {
    sqlx::query_scalar(sql)
        .bind(resource)
        .bind(token.get().to_string())
        .fetch_one(conn)
        .await
}

/// What the admission statement of `mode` returned (as text; -1: no
/// writer yet) decides.
fn admission(stored: &str, token: FencingToken, mode: LockMode) -> Result<Admission> {
    let read_back = if stored.starts_with('-') {
        None
    } else {
        Some(parse_token(stored)?)
    };
    Ok(fencelock_sql_common::admission(read_back, token, mode))
}

#[async_trait]
impl Fence for PostgresFence {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        self.read_token(&self.highest_sql, resource).await
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
        let stored = self
            .options
            .bounded("admitting a token", async {
                let mut s = self.pool.session().await?;
                let stored = admit(s.conn()?, self.admit_sql(mode), resource, token).await;
                s.finish_after(stored)
            })
            .await?;
        admission(&stored, token, mode)
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        self.read_token(&self.highest_writer_sql, resource).await
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
        let stored = self
            .options
            .bounded("writing a value", async {
                let mut s = self.pool.session().await?;
                let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                let stored = admit(&mut tx, self.admit_sql(mode), resource, token).await?;
                // The upsert keeps the fence row locked until the commit, so
                // no lower token's value can land after this one.
                if matches!(admission(&stored, token, mode), Ok(Admission::Admitted)) {
                    sqlx::query(&self.store_value_sql)
                        .bind(resource)
                        .bind(token.get().to_string())
                        .bind(value)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                s.finish();
                Ok(stored)
            })
            .await?;
        admission(&stored, token, mode)
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let row: Option<(String, Vec<u8>)> = self
            .options
            .bounded(
                "reading a value",
                self.pool
                    .fetch_optional_as(sqlx::query_as(&self.read_value_sql).bind(resource)),
            )
            .await?;
        row.map(|(token, value)| Ok(FencedValue::new(parse_token(&token)?, value)))
            .transpose()
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let had: Option<String> = self
            .options
            .bounded("resetting a fence", async {
                let mut s = self.pool.session().await?;
                let had = self.reset.run::<Postgres, _>(s.conn()?, resource).await;
                s.finish_after(had)
            })
            .await?;
        had.as_deref().map(parse_token).transpose()
    }
}
