//! Table names and the idempotent, concurrency-safe schema setup, in SQL
//! that MySQL 8.0+ and MariaDB 10.6+ both accept (docs/mysql.md lists which
//! statement relies on what).

use sqlx::MySqlConnection;

use crate::error::map;

/// The names of everything the library creates, from one validated prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub prefix: String,
    pub locks: String,
    pub readers: String,
    pub fences: String,
    /// The fenced key-value store: a value per fenced resource.
    pub fence_values: String,
    /// The token counter: one row, advanced with `LAST_INSERT_ID(expr)`.
    pub counter: String,
    /// The MariaDB sequence that issued tokens before the counter; only
    /// read (and retired) by the upgrade.
    pub legacy_sequence: String,
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
            counter: format!("{prefix}counter"),
            legacy_sequence: format!("{prefix}tokens"),
        }
    }
}

/// Names and owners compare byte for byte, in a NO PAD binary collation:
/// the PAD SPACE `utf8mb4_bin` would make `a` and `a ` the same lock. The
/// two engines name it differently; the first one the server knows is used.
const COLLATIONS: [&str; 2] = ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"];

/// Creates the schema if it is missing, and upgrades one made by an earlier
/// version. DDL cannot run in a transaction in MySQL, so two processes
/// starting at once serialise on a named lock (`GET_LOCK`) held by one
/// session around the whole setup.
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
    if present(&mut *conn, n).await? {
        return Ok(());
    }
    let fail = |e| map("creating the schema", e);
    let lock_name = format!("fencelock:schema:{}", n.prefix);
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
    // Whoever held the lock before may have completed everything: DDL only
    // ever runs while the schema is incomplete, that is before any process
    // of this version can acquire.
    let created = match present(&mut *conn, n).await {
        Ok(true) => Ok(()),
        Ok(false) => create(&mut *conn, n).await.map_err(fail),
        Err(e) => Err(e),
    };
    sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(&lock_name)
        .execute(&mut *conn)
        .await
        .map_err(fail)?;
    created
}

/// Every step checks what exists first, so a setup interrupted anywhere
/// (crash, time-out) is completed by the next one.
async fn create(conn: &mut MySqlConnection, n: &Names) -> Result<(), sqlx::Error> {
    let (p, locks, fences, readers, counter) =
        (&n.prefix, &n.locks, &n.fences, &n.readers, &n.counter);
    let collation = collation(&mut *conn).await?;
    let text = format!("VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation}");
    let tables = [
        format!(
            "CREATE TABLE IF NOT EXISTS {locks} (
               `key` {text} NOT NULL PRIMARY KEY,
               owner {text} NOT NULL,
               token BIGINT UNSIGNED NOT NULL,
               kind {text} NULL,
               data JSON NULL,
               acquired_at DATETIME(6) NOT NULL,
               expires_at DATETIME(6) NOT NULL,
               updated_at DATETIME(6) NOT NULL,
               readers_until DATETIME(6) NULL,
               intent_owner {text} NULL,
               intent_until DATETIME(6) NULL,
               KEY {p}locks_owner_idx (owner),
               KEY {p}locks_expires_idx (expires_at)
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {fences} (
               resource {text} NOT NULL PRIMARY KEY,
               token BIGINT UNSIGNED NOT NULL,
               writer_token BIGINT UNSIGNED NULL
             ) ENGINE=InnoDB"
        ),
        // MEDIUMBLOB: a BLOB stops one byte short of MAX_FENCED_VALUE.
        format!(
            "CREATE TABLE IF NOT EXISTS {} (
               resource {text} NOT NULL PRIMARY KEY,
               token BIGINT UNSIGNED NOT NULL,
               value MEDIUMBLOB NOT NULL
             ) ENGINE=InnoDB",
            n.fence_values
        ),
    ];
    for ddl in &tables {
        sqlx::query(ddl).execute(&mut *conn).await?;
    }
    // Read-write locks (docs/rwlock.md) added columns to tables made before
    // them: nullable, so no rewrite of the rows' data. `readers_until` ends
    // with the key's last reader lease; `intent_*` is a waiting writer's
    // intent; a fence's `writer_token` is its highest writer token (NULL in
    // rows from before, whose token was a writer's). MySQL has no
    // `ADD COLUMN IF NOT EXISTS`, hence the look first.
    if !has_column(&mut *conn, locks, "readers_until").await? {
        sqlx::query(&format!(
            "ALTER TABLE {locks} ADD COLUMN readers_until DATETIME(6) NULL,
               ADD COLUMN intent_owner {text} NULL,
               ADD COLUMN intent_until DATETIME(6) NULL"
        ))
        .execute(&mut *conn)
        .await?;
    }
    if !has_column(&mut *conn, fences, "writer_token").await? {
        sqlx::query(&format!(
            "ALTER TABLE {fences} ADD COLUMN writer_token BIGINT UNSIGNED NULL"
        ))
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {readers} (
           `key` {text} NOT NULL,
           owner {text} NOT NULL,
           token BIGINT UNSIGNED NOT NULL,
           kind {text} NULL,
           data JSON NULL,
           acquired_at DATETIME(6) NOT NULL,
           expires_at DATETIME(6) NOT NULL,
           updated_at DATETIME(6) NOT NULL,
           PRIMARY KEY (`key`, token),
           KEY {p}readers_owner_idx (owner)
         ) ENGINE=InnoDB"
    ))
    .execute(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {counter} (
           id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
           v BIGINT UNSIGNED NOT NULL
         ) ENGINE=InnoDB"
    ))
    .execute(&mut *conn)
    .await?;
    seed_counter(conn, n).await
}

/// Writes the counter's row, last: its presence means the schema is
/// complete. The first value is above every token the prefix's tables
/// hold, and above every value the sequence of earlier versions issued.
async fn seed_counter(conn: &mut MySqlConnection, n: &Names) -> Result<(), sqlx::Error> {
    let (locks, fences, readers, counter) = (&n.locks, &n.fences, &n.readers, &n.counter);
    let legacy = &n.legacy_sequence;
    let retired = format!("{legacy}_retired");
    // Renamed before it is read, so that a process of an earlier version
    // still running fails loudly (no such table) instead of drawing a
    // token from it that the counter would issue again. RENAME waits for
    // statements using the sequence to end. Only MariaDB can have one.
    if table_exists(&mut *conn, legacy).await? {
        sqlx::query(&format!("RENAME TABLE {legacy} TO {retired}"))
            .execute(&mut *conn)
            .await?;
    }
    let issued: u64 = if table_exists(&mut *conn, &retired).await? {
        // NEXTVAL is above every value handed out, even those of a cache
        // batch lost in a crash.
        let next: i64 = sqlx::query_scalar(&format!("SELECT NEXTVAL({retired})"))
            .fetch_one(&mut *conn)
            .await?;
        u64::try_from(next).unwrap_or(0)
    } else {
        0
    };
    let held: Option<u64> = sqlx::query_scalar(&format!(
        "SELECT CAST(GREATEST(COALESCE((SELECT MAX(token) FROM {locks}), 0),
                              COALESCE((SELECT MAX(token) FROM {readers}), 0),
                              COALESCE((SELECT MAX(token) FROM {fences}), 0)) AS UNSIGNED)"
    ))
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(&format!("INSERT INTO {counter} (id, v) VALUES (1, ?)"))
        .bind(issued.max(held.unwrap_or(0)))
        .execute(&mut *conn)
        .await?;
    if table_exists(&mut *conn, &retired).await? {
        sqlx::query(&format!("DROP TABLE {retired}"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The first of [`COLLATIONS`] the server has.
async fn collation(conn: &mut MySqlConnection) -> Result<&'static str, sqlx::Error> {
    for name in COLLATIONS {
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.COLLATIONS WHERE COLLATION_NAME = ?",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await?;
        if found > 0 {
            return Ok(name);
        }
    }
    Err(sqlx::Error::Configuration(
        format!("the server has none of the collations {COLLATIONS:?}").into(),
    ))
}

async fn has_column(
    conn: &mut MySqlConnection,
    table: &str,
    column: &str,
) -> Result<bool, sqlx::Error> {
    let found: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS
          WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
    )
    .bind(table)
    .bind(column)
    .fetch_one(conn)
    .await?;
    Ok(found > 0)
}

async fn table_exists(conn: &mut MySqlConnection, table: &str) -> Result<bool, sqlx::Error> {
    let found: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES
          WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(table)
    .fetch_one(conn)
    .await?;
    Ok(found > 0)
}

/// Whether the schema is complete: the five tables exist (the counter is
/// created last; a schema from before fenced values lacks theirs) and the
/// counter has its row (written last).
async fn present(conn: &mut MySqlConnection, n: &Names) -> fencelock_core::Result<bool> {
    let fail = |e| map("reading the schema", e);
    let found: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES
          WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?, ?, ?, ?)",
    )
    .bind(&n.locks)
    .bind(&n.fences)
    .bind(&n.fence_values)
    .bind(&n.readers)
    .bind(&n.counter)
    .fetch_one(&mut *conn)
    .await
    .map_err(fail)?;
    if found != 5 {
        return Ok(false);
    }
    let rows: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", n.counter))
        .fetch_one(conn)
        .await
        .map_err(fail)?;
    Ok(rows > 0)
}
