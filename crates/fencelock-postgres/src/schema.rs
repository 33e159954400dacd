//! Table names and the idempotent, concurrency-safe schema setup.

use sqlx::PgPool;

use crate::error::map;

/// The names of everything the library creates, from one validated prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub prefix: String,
    pub locks: String,
    pub fences: String,
    pub tokens: String,
    pub channel: String,
}

impl Names {
    /// `prefix` has passed `fencelock_sql_common::validate_prefix`, so it is
    /// safe to splice into SQL text unquoted.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            locks: format!("{prefix}locks"),
            fences: format!("{prefix}fences"),
            tokens: format!("{prefix}tokens"),
            channel: format!("{prefix}release"),
        }
    }
}

/// Creates the schema if it is missing. `CREATE … IF NOT EXISTS` alone is not
/// safe when two processes start at once (both see "missing" and one fails on
/// the catalog's unique index), so the DDL runs in one transaction under an
/// advisory lock keyed by the prefix.
pub(crate) async fn ensure(pool: &PgPool, n: &Names) -> fencelock_core::Result<()> {
    let (p, tokens, locks, fences) = (&n.prefix, &n.tokens, &n.locks, &n.fences);
    let ddl = [
        format!("CREATE SEQUENCE IF NOT EXISTS {tokens} AS bigint"),
        format!(
            "CREATE TABLE IF NOT EXISTS {locks} (
             key text COLLATE \"C\" PRIMARY KEY,
             owner text NOT NULL,
             token bigint NOT NULL,
             kind text,
             data jsonb,
             acquired_at timestamptz NOT NULL,
             expires_at timestamptz NOT NULL,
             updated_at timestamptz NOT NULL
         )"
        ),
        format!("CREATE INDEX IF NOT EXISTS {p}locks_owner_idx ON {locks} (owner)"),
        format!("CREATE INDEX IF NOT EXISTS {p}locks_expires_idx ON {locks} (expires_at)"),
        format!(
            "CREATE TABLE IF NOT EXISTS {fences} (
             resource text PRIMARY KEY,
             token numeric(20, 0) NOT NULL
         )"
        ),
    ];
    let fail = |e| map("creating the schema", e);
    let mut tx = pool.begin().await.map_err(fail)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("fencelock:schema:{}", n.prefix))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    for statement in &ddl {
        sqlx::query(statement)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
    }
    tx.commit().await.map_err(fail)
}
