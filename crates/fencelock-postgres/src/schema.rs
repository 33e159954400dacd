//! Table names and the idempotent, concurrency-safe schema setup.

use std::time::Duration;

use sqlx::PgConnection;

use crate::error::map;

/// The names of everything the library creates, from one validated prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub prefix: String,
    pub locks: String,
    pub readers: String,
    pub fences: String,
    pub fence_values: String,
    pub tokens: String,
}

impl Names {
    /// `prefix` has passed `fencelock_sql_common::validate_prefix`, so it is
    /// safe to splice into SQL text unquoted.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            locks: format!("{prefix}locks"),
            readers: format!("{prefix}readers"),
            fences: format!("{prefix}fences"),
            fence_values: format!("{prefix}fence_values"),
            tokens: format!("{prefix}tokens"),
        }
    }
}

/// The schema this code needs; recorded in the locks table's comment as
/// `fencelock schema <n>` once every object of that version exists.
/// Version 2: lease data is `json` (was `jsonb`, which refuses `\u0000`).
/// Version 3: read-write locks (`docs/rwlock.md`): the readers table, the
/// key's reader horizon and writer intent on the locks row, and the fence's
/// highest writer token.
/// Version 4: the token sequence ends at `FencingToken::MAX` (2^53 − 1).
/// Version 5: the fenced key-value store's table.
const VERSION: u32 = 5;
const VERSION_TAG: &str = "fencelock schema ";
/// The sequence's MAXVALUE.
const MAX_TOKEN: u64 = fencelock_core::FencingToken::MAX.0;

/// Makes sure the schema of [`VERSION`] (or newer) exists, on `conn`, the
/// pool's first connection.
///
/// The check reads the catalog only and takes no lock on the tables, so a
/// process starting next to a long transaction on the locks table neither
/// waits nor makes others wait. (Even a no-op `CREATE INDEX IF NOT EXISTS`
/// takes a SHARE lock on the table: queued behind any open writer, it blocks
/// every renewal queued after it.) DDL runs only when the schema is missing
/// or older, creates only what is missing, and gives up after `lock_timeout`
/// rather than queue for a lock indefinitely. `CREATE … IF NOT EXISTS` alone
/// is not safe when two processes start at once (both see "missing" and one
/// fails on the catalog's unique index), so the DDL runs in one transaction
/// under an advisory lock keyed by the prefix.
pub(crate) async fn ensure(
    conn: &mut PgConnection,
    n: &Names,
    lock_timeout: Duration,
) -> fencelock_core::Result<()> {
    if current(&mut *conn, n).await? {
        return Ok(());
    }
    let (p, tokens, locks, fences) = (&n.prefix, &n.tokens, &n.locks, &n.fences);
    let readers = &n.readers;
    let objects = [
        (
            tokens.clone(),
            format!("CREATE SEQUENCE {tokens} AS bigint MAXVALUE {MAX_TOKEN}"),
        ),
        (
            locks.clone(),
            format!(
                "CREATE TABLE {locks} (
                 key text COLLATE \"C\" PRIMARY KEY,
                 owner text NOT NULL,
                 token bigint NOT NULL,
                 kind text,
                 data json,
                 acquired_at timestamptz NOT NULL,
                 expires_at timestamptz NOT NULL,
                 updated_at timestamptz NOT NULL
             )"
            ),
        ),
        (
            format!("{p}locks_owner_idx"),
            format!("CREATE INDEX {p}locks_owner_idx ON {locks} (owner)"),
        ),
        (
            format!("{p}locks_expires_idx"),
            format!("CREATE INDEX {p}locks_expires_idx ON {locks} (expires_at)"),
        ),
        (
            fences.clone(),
            format!(
                "CREATE TABLE {fences} (
                 resource text PRIMARY KEY,
                 token numeric(20, 0) NOT NULL
             )"
            ),
        ),
        (
            readers.clone(),
            format!(
                "CREATE TABLE {readers} (
                 key text COLLATE \"C\" NOT NULL,
                 owner text NOT NULL,
                 token bigint NOT NULL,
                 kind text,
                 data json,
                 acquired_at timestamptz NOT NULL,
                 expires_at timestamptz NOT NULL,
                 updated_at timestamptz NOT NULL,
                 PRIMARY KEY (key, token)
             )"
            ),
        ),
        (
            format!("{p}readers_owner_idx"),
            format!("CREATE INDEX {p}readers_owner_idx ON {readers} (owner)"),
        ),
        (
            n.fence_values.clone(),
            format!(
                "CREATE TABLE {} (
                 resource text PRIMARY KEY,
                 token numeric(20, 0) NOT NULL,
                 value bytea NOT NULL
             )",
                n.fence_values
            ),
        ),
    ];
    let fail = |e| map("creating the schema", e);
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(fail)?;
    sqlx::query(&format!(
        "SET LOCAL lock_timeout = '{}ms'",
        lock_timeout.as_millis().max(1)
    ))
    .execute(&mut *tx)
    .await
    .map_err(fail)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("fencelock:schema:{}", n.prefix))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    // Whoever held the advisory lock before may have done it all.
    if current(&mut tx, n).await? {
        return tx.commit().await.map_err(fail);
    }
    for (name, create) in &objects {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .map_err(fail)?;
        if !exists {
            sqlx::query(create).execute(&mut *tx).await.map_err(fail)?;
        }
    }
    // From version 1. Rewrites the table under an ACCESS EXCLUSIVE lock,
    // once, bounded by `lock_timeout` like all of this.
    let data_type: Option<String> = sqlx::query_scalar(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
          WHERE attrelid = to_regclass($1) AND attname = 'data'",
    )
    .bind(locks)
    .fetch_optional(&mut *tx)
    .await
    .map_err(fail)?;
    if data_type.as_deref() == Some("jsonb") {
        sqlx::query(&format!(
            "ALTER TABLE {locks} ALTER COLUMN data TYPE json USING data::json"
        ))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    }
    // From version 2: nullable columns without defaults, so adding them
    // only changes the catalog. `readers_until` is the end of the key's
    // last reader lease, kept on the row that the writer's upsert locks and
    // re-checks; `intent_*` is a waiting writer's intent; a fence's
    // `writer_token` is its highest writer token (NULL in rows from before:
    // their tokens were all writers'; -1 when only readers were admitted).
    for (table, column, kind) in [
        (locks, "readers_until", "timestamptz"),
        (locks, "intent_owner", "text"),
        (locks, "intent_until", "timestamptz"),
        (fences, "writer_token", "numeric(20, 0)"),
    ] {
        sqlx::query(&format!(
            "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}"
        ))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    }
    // From version 3: the sequence ran to i64::MAX, past the tokens every
    // backend can issue exactly. Only the limit changes; a sequence that
    // is already beyond it answers its next draw with SQLSTATE 2200H,
    // which grants report as `TokensExhausted`.
    sqlx::query(&format!("ALTER SEQUENCE {tokens} MAXVALUE {MAX_TOKEN}"))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    // SHARE UPDATE EXCLUSIVE: does not wait for, or block, lock statements.
    sqlx::query(&format!(
        "COMMENT ON TABLE {locks} IS '{VERSION_TAG}{VERSION}'"
    ))
    .execute(&mut *tx)
    .await
    .map_err(fail)?;
    tx.commit().await.map_err(fail)
}

/// Whether the schema is complete at [`VERSION`] or newer (a newer
/// library's schema is left alone).
async fn current(conn: &mut PgConnection, n: &Names) -> fencelock_core::Result<bool> {
    let comment: Option<String> =
        sqlx::query_scalar("SELECT obj_description(to_regclass($1), 'pg_class')")
            .bind(&n.locks)
            .fetch_one(conn)
            .await
            .map_err(|e| map("reading the schema", e))?;
    Ok(comment
        .as_deref()
        .and_then(|c| c.strip_prefix(VERSION_TAG))
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v >= VERSION))
}
