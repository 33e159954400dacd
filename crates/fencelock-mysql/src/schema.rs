//! Table names and the idempotent, concurrency-safe schema setup.

use sqlx::MySqlConnection;

use crate::error::map;

/// The names of everything the library creates, from one validated prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub prefix: String,
    pub locks: String,
    pub readers: String,
    pub fences: String,
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
            tokens: format!("{prefix}tokens"),
        }
    }
}

/// Names and owners compare byte for byte: `utf8mb4_nopad_bin`, because the
/// PAD SPACE `utf8mb4_bin` would make `a` and `a ` the same lock.
const TEXT: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin";

/// Creates the schema if it is missing. DDL cannot run in a transaction in
/// MySQL, so two processes starting at once serialise on a named lock
/// (`GET_LOCK`) held by one session around the whole setup.
///
/// When everything exists already, no DDL runs at all: even a no-op
/// `CREATE TABLE IF NOT EXISTS` queues for an exclusive metadata lock, and
/// a queued exclusive request blocks other sessions' statements on the
/// table. One of those may be the second statement of an acquisition that
/// holds a key's turn while a third session waits for that turn inside its
/// own INSERT: a deadlock (seen with 50 CLI processes starting at once).
///
/// Runs on `conn`, the pool's first connection, so that opening a backend
/// uses one connection.
pub(crate) async fn ensure(conn: &mut MySqlConnection, n: &Names) -> fencelock_core::Result<()> {
    let (p, tokens, locks, fences) = (&n.prefix, &n.tokens, &n.locks, &n.fences);
    let readers = &n.readers;
    if present(&mut *conn, n).await? {
        return Ok(());
    }
    let ddl = [
        // Sequences are non-transactional and persist their next value
        // ahead of use (one cache batch), so values never repeat, even after
        // a crash: see docs/mysql.md.
        format!("CREATE SEQUENCE IF NOT EXISTS {tokens} ENGINE=InnoDB"),
        format!(
            "CREATE TABLE IF NOT EXISTS {locks} (
               `key` {TEXT} NOT NULL PRIMARY KEY,
               owner {TEXT} NOT NULL,
               token BIGINT UNSIGNED NOT NULL,
               kind {TEXT} NULL,
               data JSON NULL,
               acquired_at DATETIME(6) NOT NULL,
               expires_at DATETIME(6) NOT NULL,
               updated_at DATETIME(6) NOT NULL,
               KEY {p}locks_owner_idx (owner),
               KEY {p}locks_expires_idx (expires_at)
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {fences} (
               resource {TEXT} NOT NULL PRIMARY KEY,
               token BIGINT UNSIGNED NOT NULL
             ) ENGINE=InnoDB"
        ),
        // Read-write locks (docs/rwlock.md), added in place to tables made
        // before them: nullable columns (no rewrite of the rows' data).
        // `readers_until` ends with the key's last reader lease, on the
        // row that the writer's upsert re-reads under its row lock;
        // `intent_*` is a waiting writer's intent; a fence's
        // `writer_token` is its highest writer token (NULL in rows from
        // before, whose token was a writer's; 0 while only readers were
        // admitted).
        format!(
            "ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS readers_until DATETIME(6) NULL,
               ADD COLUMN IF NOT EXISTS intent_owner {TEXT} NULL,
               ADD COLUMN IF NOT EXISTS intent_until DATETIME(6) NULL"
        ),
        format!("ALTER TABLE {fences} ADD COLUMN IF NOT EXISTS writer_token BIGINT UNSIGNED NULL"),
        // Created last: its presence means the whole schema is current.
        format!(
            "CREATE TABLE IF NOT EXISTS {readers} (
               `key` {TEXT} NOT NULL,
               owner {TEXT} NOT NULL,
               token BIGINT UNSIGNED NOT NULL,
               kind {TEXT} NULL,
               data JSON NULL,
               acquired_at DATETIME(6) NOT NULL,
               expires_at DATETIME(6) NOT NULL,
               updated_at DATETIME(6) NOT NULL,
               PRIMARY KEY (`key`, token),
               KEY {p}readers_owner_idx (owner)
             ) ENGINE=InnoDB"
        ),
    ];
    let fail = |e| map("creating the schema", e);
    let lock_name = format!("fencelock:schema:{p}");
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
        .bind(&lock_name)
        .fetch_one(&mut *conn)
        .await
        .map_err(fail)?;
    if got != Some(1) {
        return Err(crate::error::bad_reply(
            "another process held the schema lock for 60 s",
        ));
    }
    let created = create_if_missing(&mut *conn, n, &ddl).await;
    sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(&lock_name)
        .execute(&mut *conn)
        .await
        .map_err(fail)?;
    created
}

/// Runs the DDL, under the schema lock, unless whoever held the lock before
/// has created everything. So DDL only ever runs while the tables are
/// incomplete, that is before any process can acquire, and never beside
/// acquisitions.
async fn create_if_missing(
    conn: &mut MySqlConnection,
    n: &Names,
    ddl: &[String],
) -> fencelock_core::Result<()> {
    if present(conn, n).await? {
        return Ok(());
    }
    for statement in ddl {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .map_err(|e| map("creating the schema", e))?;
    }
    Ok(())
}

/// Whether all four tables exist. They are created (and the older ones
/// upgraded) in order, the readers table last, so all four means
/// "complete".
async fn present(conn: &mut MySqlConnection, n: &Names) -> fencelock_core::Result<bool> {
    let found: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES
          WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?, ?, ?)",
    )
    .bind(&n.tokens)
    .bind(&n.locks)
    .bind(&n.fences)
    .bind(&n.readers)
    .fetch_one(conn)
    .await
    .map_err(|e| map("reading the schema", e))?;
    Ok(found == 4)
}
