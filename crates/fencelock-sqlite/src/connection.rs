//! Opening a lock database: URL options, pragmas, schema, and running
//! blocking SQLite calls off the async runtime.

use std::{
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use fencelock_core::Result;
use rusqlite::{Connection, OpenFlags};

use crate::{
    error,
    options::{SqliteOptions, Synchronous},
};

/// Everything fencelock keeps in the database. `IF NOT EXISTS` makes it
/// idempotent, and running it in an IMMEDIATE transaction makes concurrent
/// first starts of several processes wait for each other instead of failing.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fencelock_locks (
    key              TEXT PRIMARY KEY,
    owner            TEXT NOT NULL,
    token            INTEGER NOT NULL,
    kind             TEXT,
    data             TEXT,
    -- Wall-clock times, for people reading the table only.
    acquired_at_ms   INTEGER NOT NULL,
    expires_at_ms    INTEGER NOT NULL,
    -- The lease itself, on the host's boot-time clock (see clock.rs).
    boot_id          TEXT NOT NULL,
    acquired_mono_us INTEGER NOT NULL,
    renewed_mono_us  INTEGER NOT NULL,
    expires_mono_us  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencelock_locks_owner ON fencelock_locks (owner);
CREATE INDEX IF NOT EXISTS fencelock_locks_expiry ON fencelock_locks (expires_mono_us);
-- One counter for all keys: a token above every token ever issued is above
-- every token issued for any one key, and deleting lease rows cannot lower it.
CREATE TABLE IF NOT EXISTS fencelock_counter (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    last_token INTEGER NOT NULL
);
INSERT OR IGNORE INTO fencelock_counter (id, last_token) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS fencelock_fences (
    resource TEXT PRIMARY KEY,
    -- Zero-padded to 20 digits so that text order is numeric order for the
    -- whole u64 range (SQLite integers stop at i64::MAX).
    token    TEXT NOT NULL,
    -- The highest writer token (docs/rwlock.md), padded the same way;
    -- NULL in rows from before read-write locks, whose tokens were all
    -- writers'.
    writer_token TEXT
) WITHOUT ROWID;
-- Readers of read-write locks (docs/rwlock.md): the columns of
-- fencelock_locks, one row per reader lease.
CREATE TABLE IF NOT EXISTS fencelock_readers (
    key              TEXT NOT NULL,
    owner            TEXT NOT NULL,
    token            INTEGER NOT NULL,
    kind             TEXT,
    data             TEXT,
    acquired_at_ms   INTEGER NOT NULL,
    expires_at_ms    INTEGER NOT NULL,
    boot_id          TEXT NOT NULL,
    acquired_mono_us INTEGER NOT NULL,
    renewed_mono_us  INTEGER NOT NULL,
    expires_mono_us  INTEGER NOT NULL,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencelock_readers_owner ON fencelock_readers (owner);
-- The fenced key-value store (Fence::write_value): the value last stored
-- with an admission, and its writer's token, padded like the fence's.
CREATE TABLE IF NOT EXISTS fencelock_fence_values (
    resource TEXT PRIMARY KEY,
    token    TEXT NOT NULL,
    value    BLOB NOT NULL
);
-- A waiting writer's intent per key: a lease that stops new readers.
CREATE TABLE IF NOT EXISTS fencelock_intents (
    key             TEXT PRIMARY KEY,
    owner           TEXT NOT NULL,
    boot_id         TEXT NOT NULL,
    renewed_mono_us INTEGER NOT NULL,
    expires_mono_us INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Adds what read-write locks need to a `fencelock_fences` table created
/// before them (the other tables are new, so `IF NOT EXISTS` creates them).
const UPGRADE_FENCES: &str = "ALTER TABLE fencelock_fences ADD COLUMN writer_token TEXT;";

/// One SQLite connection, used from blocking threads one call at a time.
#[derive(Clone, Debug)]
pub(crate) struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl Db {
    /// Opens the file, sets the pragmas and creates the schema.
    pub(crate) async fn open(options: &SqliteOptions) -> Result<Self> {
        let options = options.clone();
        let conn = tokio::task::spawn_blocking(move || open_blocking(&options))
            .await
            .map_err(error::task)??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` with the connection on a blocking thread.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            // A panic mid-call leaves SQLite consistent (an open transaction
            // rolls back when its handle is dropped), so a poisoned lock is
            // still a usable connection.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(error::task)?
    }
}

pub(crate) fn open_blocking(options: &SqliteOptions) -> Result<Connection> {
    if !options.create && !options.path.is_file() {
        // Checked here rather than left to SQLite's "unable to open", which
        // does not say which of file and directory is missing.
        return Err(fencelock_core::BackendError::message(
            error::NAME,
            fencelock_core::ErrorStatus::Permanent,
            format!("no lock database at {}", options.path.display()),
        )
        .into());
    }
    if options.create {
        create_parent_dir(&options.path)?;
    }
    let flags = if options.create {
        OpenFlags::default()
    } else {
        OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE
    };
    let conn = Connection::open_with_flags(&options.path, flags).map_err(|e| {
        fencelock_core::BackendError::permanent(
            error::NAME,
            format!("cannot open {}", options.path.display()),
            e,
        )
    })?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(error::map)?;
    let deadline = Instant::now() + options.busy_timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        let prepared = if options.create {
            prepare(&conn, options)
        } else {
            prepare_existing(&conn, options)
        };
        match prepared {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
            {
                // While another connection switches a new file to WAL,
                // SQLite reports "database is locked" at once rather than
                // calling the busy handler, so the open waits here, within
                // the same busy timeout as every other statement. Every
                // step of `prepare` is idempotent.
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(error::map(e)),
            Ok(false) => {
                return Err(fencelock_core::BackendError::message(
                    error::NAME,
                    fencelock_core::ErrorStatus::Permanent,
                    format!(
                        "{} holds no fencelock tables, or tables an older version made \
                         (a command that takes a lock creates or upgrades them)",
                        options.path.display()
                    ),
                )
                .into())
            }
            Ok(true) => return Ok(conn),
        }
    }
}

/// Creates the directories above the database file that are missing,
/// readable by their owner only: other users have no business with the locks
/// (nor the power to delete them).
fn create_parent_dir(path: &Path) -> Result<()> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        fencelock_core::BackendError::permanent(
            error::NAME,
            format!(
                "cannot create the directory {} for the lock database",
                dir.display()
            ),
            e,
        )
        .into()
    })
}

/// Puts a freshly opened connection in fencelock's modes and makes sure the
/// schema exists; always `true` (the schema is there).
fn prepare(conn: &Connection, options: &SqliteOptions) -> rusqlite::Result<bool> {
    // WAL lets readers run beside the one writer; it is a property of the
    // file, so setting it again is a no-op.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %options.path.display(), mode, "SQLite refused WAL mode");
    }
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))?;
    create_schema(conn).map(|()| true)
}

/// [`prepare`] for an opening that must not write (`create=false`): the
/// journal mode is left as the file has it (a store fencelock made is in
/// WAL already), and `false` if the schema is missing or outdated.
fn prepare_existing(conn: &Connection, options: &SqliteOptions) -> rusqlite::Result<bool> {
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))?;
    schema_current(conn)
}

/// Whether every table of fencelock's schema exists in its current form.
fn schema_current(conn: &Connection) -> rusqlite::Result<bool> {
    let present: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
         AND name IN ('fencelock_locks', 'fencelock_counter', 'fencelock_fences', \
             'fencelock_readers', 'fencelock_intents', 'fencelock_fence_values')",
        [],
        |r| r.get(0),
    )?;
    if present != 6 {
        return Ok(false);
    }
    conn.query_row(
        "SELECT count(*) FROM pragma_table_info('fencelock_fences') \
         WHERE name = 'writer_token'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n == 1),
    )
}

/// Creates fencelock's tables in `conn`'s database if they are missing.
/// Safe to call from several processes at once.
pub fn ensure_schema(conn: &Connection) -> Result<()> {
    create_schema(conn).map_err(error::map)
}

fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    // A read first, so that opening an initialised database does not take
    // the write lock. (`PRAGMA user_version` is left alone: the fence tables
    // may live in an application's own database, whose migrations own it.)
    if schema_current(conn)? {
        return Ok(());
    }
    let fences_current = || -> rusqlite::Result<bool> {
        conn.query_row(
            "SELECT count(*) FROM pragma_table_info('fencelock_fences') \
             WHERE name = 'writer_token'",
            [],
            |r| r.get::<_, i64>(0).map(|n| n == 1),
        )
    };
    // Decided again under the write lock: another process may have
    // upgraded the file meanwhile.
    let upgrade = |conn: &Connection| -> rusqlite::Result<()> {
        conn.execute_batch(SCHEMA)?;
        if !fences_current()? {
            conn.execute_batch(UPGRADE_FENCES)?;
        }
        Ok(())
    };
    if !conn.is_autocommit() {
        // Inside the caller's transaction: its commit makes the tables.
        return upgrade(conn);
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    upgrade(conn)
        .and_then(|()| conn.execute_batch("COMMIT"))
        .inspect_err(|_| {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        })
}
