//! SQLite-specific behaviour: the host clock, schema creation, the
//! in-transaction fence and URL options.
//!
//! Time: the database is a real file that real connections lock, and
//! SQLite's busy handler sleeps on the real clock, so none of these can run
//! on tokio's paused clock. Only the racing first opens have a bound that a
//! busy machine could overrun (the busy timeout each open waits within):
//! it is a base figure scaled by a [`Patience`] measured at the start. The
//! other tests' leases (600 s and more) are checked against margins of
//! minutes, and the renewers and inspectors that race take a writer kept
//! out past the busy timeout as the transient error it is.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, Driver, Error, Fence, FencingToken, LeaseId,
    LockKey, LockMode, Owner, Renewal,
};
use fencelock_sqlite::{ensure_schema, SqliteBackend, SqliteDriver, SqliteFence, SqliteOptions};
use fencelock_testkit::{
    async_trait,
    txfence::{self, FenceTransaction, TransactionalFence},
    Patience, TestResult,
};
use rusqlite::Connection;

fn request(key: &str, owner: &str) -> AcquireRequest {
    AcquireRequest::new(
        LockKey::new(key).unwrap(),
        Owner::new(owner).unwrap(),
        Duration::from_secs(600),
    )
}

async fn granted(backend: &SqliteBackend, key: &str, owner: &str) -> FencingToken {
    match backend.try_acquire(&request(key, owner)).await.unwrap() {
        Acquire::Granted(g) => g.token,
        held => panic!("{key} not granted: {held:?}"),
    }
}

/// Edits lease rows behind the library's back, as a reboot or a clock
/// change would leave them.
fn tamper(path: &std::path::Path, sql: &str) {
    Connection::open(path).unwrap().execute_batch(sql).unwrap();
}

#[tokio::test]
async fn a_lease_from_another_boot_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect_with(SqliteOptions::new(&path))
        .await
        .unwrap();
    let before = granted(&backend, "k", "old").await;
    tamper(
        &path,
        "UPDATE fencelock_locks SET boot_id = 'a-previous-boot'",
    );
    assert!(backend
        .inspect(&LockKey::new("k").unwrap())
        .await
        .unwrap()
        .is_none());
    let after = granted(&backend, "k", "new").await;
    assert!(after > before);
    let stale = backend
        .renew(
            &LeaseId::new(
                LockKey::new("k").unwrap(),
                Owner::new("old").unwrap(),
                before,
            ),
            Duration::from_secs(5),
        )
        .await;
    assert!(matches!(stale, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn a_lease_renewed_in_the_clocks_future_is_expired() {
    // What a restarted clock without a boot id would look like.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect_with(SqliteOptions::new(&path))
        .await
        .unwrap();
    granted(&backend, "k", "old").await;
    tamper(
        &path,
        "UPDATE fencelock_locks SET renewed_mono_us = renewed_mono_us + 3600000000, \
         expires_mono_us = expires_mono_us + 3600000000",
    );
    assert!(backend
        .inspect(&LockKey::new("k").unwrap())
        .await
        .unwrap()
        .is_none());
    granted(&backend, "k", "new").await;
}

#[tokio::test]
async fn wall_clock_times_take_no_part_in_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect_with(SqliteOptions::new(&path))
        .await
        .unwrap();
    let token = granted(&backend, "past", "a").await;
    granted(&backend, "future", "a").await;
    // As if the wall clock had jumped a year either way since the grants.
    tamper(
        &path,
        "UPDATE fencelock_locks SET expires_at_ms = 0 WHERE key = 'past'",
    );
    tamper(
        &path,
        "UPDATE fencelock_locks SET acquired_at_ms = 4102444800000 WHERE key = 'future'",
    );
    let past = backend
        .inspect(&LockKey::new("past").unwrap())
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(past.token, token);
    assert!(past.expires_in > Duration::from_secs(500));
    assert!(matches!(
        backend.try_acquire(&request("future", "b")).await.unwrap(),
        Acquire::Held(_)
    ));
    assert_eq!(backend.cleanup_expired().await.unwrap(), 0);
}

/// Switching a new file to WAL needs an exclusive lock, and SQLite answers
/// "database is locked" at once there instead of calling the busy handler;
/// the open must wait for its busy timeout (the default 5 s, as a base
/// figure) like every other statement. Many rounds, because one round of
/// 16 racing opens rarely collides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_of_one_file_all_succeed() {
    let p = Patience::measure().await;
    let busy_timeout = p.bound(Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    for round in 0..100 {
        let path = Arc::new(dir.path().join(format!("locks-{round}.db")));
        let opens: Vec<_> = (0..16)
            .map(|_| {
                let path = Arc::clone(&path);
                tokio::spawn(async move {
                    SqliteBackend::connect_with(
                        SqliteOptions::new(&*path).busy_timeout(busy_timeout),
                    )
                    .await
                })
            })
            .collect();
        for open in opens {
            if let Err(e) = open.await.unwrap() {
                panic!("round {round}: {e} (busy timeout {busy_timeout:?}, {p})");
            }
        }
    }
}

/// The in-transaction fence, through the testkit's one test of it, on the
/// application's own database file (where `ensure_schema` put the fence
/// table).
#[tokio::test]
async fn the_fence_commits_and_rolls_back_with_the_callers_transaction() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    ensure_schema(&Connection::open(&path)?)?;
    let fence = SqliteFence::connect_with(SqliteOptions::new(&path)).await?;
    // With the rollback journal a transaction that has read blocks every
    // writer until it ends, so no newer admission can slip in behind its
    // reads: there is no snapshot to be stale.
    txfence::fence_in_transaction(&Transactions {
        path,
        fence,
        levels: Vec::new(),
    })
    .await
}

/// The same in an application database in WAL mode, where a deferred
/// transaction reads from a snapshot while others commit: its `admit_in`
/// must not admit a token that a newer admission has made stale.
#[tokio::test]
async fn the_fence_in_a_wal_database_refuses_tokens_made_stale_after_the_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let conn = Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    ensure_schema(&conn)?;
    let fence = SqliteFence::connect_with(SqliteOptions::new(&path)).await?;
    txfence::fence_in_transaction(&Transactions {
        path,
        fence,
        // An immediate transaction blocks other writers from its start.
        levels: vec!["deferred"],
    })
    .await
}

/// Glue for [`txfence`]: each transaction on a connection of its own, as
/// an application's would be.
struct Transactions {
    path: std::path::PathBuf,
    fence: SqliteFence,
    levels: Vec<&'static str>,
}

struct Transaction(Connection);

#[async_trait]
impl TransactionalFence for Transactions {
    async fn begin(&self) -> TestResult<Box<dyn FenceTransaction>> {
        self.begin_at("immediate").await
    }
    // SQLite has no isolation levels; a deferred transaction reads from a
    // snapshot taken at its first read.
    fn isolation_levels(&self) -> Vec<&'static str> {
        self.levels.clone()
    }
    async fn begin_at(&self, level: &str) -> TestResult<Box<dyn FenceTransaction>> {
        let conn = Connection::open(&self.path)?;
        conn.execute_batch(match level {
            "immediate" => "BEGIN IMMEDIATE",
            "deferred" => "BEGIN DEFERRED",
            other => return Err(format!("unknown transaction kind {other:?}").into()),
        })?;
        Ok(Box::new(Transaction(conn)))
    }
    fn fence(&self) -> Arc<dyn Fence> {
        Arc::new(self.fence.clone())
    }
}

#[async_trait]
impl FenceTransaction for Transaction {
    async fn admit(&mut self, resource: &str, token: FencingToken) -> fencelock_core::Result<()> {
        SqliteFence::admit_in(&self.0, resource, token)
    }
    async fn execute(&mut self, sql: &str) -> TestResult {
        Ok(self.0.execute_batch(sql)?)
    }
    async fn fetch_i64(&mut self, sql: &str) -> TestResult<i64> {
        Ok(self.0.query_row(sql, [], |row| row.get(0))?)
    }
    async fn commit(self: Box<Self>) -> TestResult {
        Ok(self.0.execute_batch("COMMIT")?)
    }
    async fn rollback(self: Box<Self>) -> TestResult {
        Ok(self.0.execute_batch("ROLLBACK")?)
    }
}

#[tokio::test]
async fn urls_are_parsed_strictly() {
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "sqlite://{}?busy_timeout=250ms&synchronous=normal",
        dir.path().join("l.db").display()
    );
    SqliteDriver.open_backend(&good).await.unwrap();
    for bad in [
        "sqlite://",
        "sqlite:relative.db",
        "postgres://x/y",
        "sqlite:///tmp/x.db?busy_timeout=-1s",
        "sqlite:///tmp/x.db?synchronous=sometimes",
        "sqlite:///tmp/x.db?unknown=1",
    ] {
        let r = SqliteDriver.open_backend(bad).await;
        assert!(matches!(r, Err(Error::InvalidUrl(_))), "{bad}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_never_sees_a_held_lock_as_free_during_renewals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let key = LockKey::new("k").unwrap();
    let owner = Owner::new("holder").unwrap();
    let holder = SqliteBackend::connect_with(SqliteOptions::new(&path))
        .await
        .unwrap();
    let token = granted(&holder, "k", "holder").await;
    let renewers: Vec<_> = (0..3)
        .map(|_| {
            let (path, key, owner) = (path.clone(), key.clone(), owner.clone());
            tokio::spawn(async move {
                let b = SqliteBackend::connect_with(SqliteOptions::new(&path))
                    .await
                    .unwrap();
                let lease = LeaseId::new(key.clone(), owner.clone(), token);
                let mut renewed = 0;
                while renewed < 300 {
                    // A writer kept out past busy_timeout (a loaded
                    // machine's slow fsyncs) is told so, as a transient
                    // error the renewer retries; what this test checks is
                    // what the inspectors see meanwhile.
                    match b.renew(&lease, Duration::from_secs(600)).await {
                        Ok(_) => renewed += 1,
                        Err(e) if e.is_transient() => {}
                        Err(e) => panic!("renewal failed: {e}"),
                    }
                }
            })
        })
        .collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inspectors: Vec<_> = (0..3)
        .map(|_| {
            let (path, key, done) = (path.clone(), key.clone(), Arc::clone(&done));
            tokio::spawn(async move {
                let b = SqliteBackend::connect_with(SqliteOptions::new(&path))
                    .await
                    .unwrap();
                let mut seen_free = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    match b.inspect(&key).await {
                        Ok(None) => seen_free += 1,
                        Ok(Some(_)) => {}
                        Err(e) if e.is_transient() => {}
                        Err(e) => panic!("inspect failed: {e}"),
                    }
                }
                seen_free
            })
        })
        .collect();
    for r in renewers {
        r.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for i in inspectors {
        assert_eq!(
            i.await.unwrap(),
            0,
            "inspect reported the held lock as free"
        );
    }
}

#[tokio::test]
async fn opening_creates_the_missing_directories_of_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/a/b/locks.db", dir.path().display());
    let backend = SqliteDriver.open_backend(&url).await.unwrap();
    let grant = backend.try_acquire(&request("k", "o")).await.unwrap();
    assert!(matches!(grant, Acquire::Granted(_)), "{grant:?}");
    assert!(dir.path().join("a/b/locks.db").is_file());
    for created in ["a", "a/b"] {
        let mode = std::fs::metadata(dir.path().join(created))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{created}: {mode:o}");
    }
}

#[tokio::test]
async fn a_directory_that_cannot_be_created_is_a_clear_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where a directory should be: fails even as root.
    std::fs::write(dir.path().join("file"), "").unwrap();
    let path = dir.path().join("file/sub/locks.db");
    let err = SqliteBackend::connect_with(SqliteOptions::new(&path))
        .await
        .unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let shown = err.to_string();
    // Names the directory it could not create, not just the file.
    assert!(
        shown.contains(&format!("directory {}/file/sub ", dir.path().display())),
        "{shown}"
    );
}

#[tokio::test]
async fn a_floor_beyond_the_counter_range_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::connect_with(SqliteOptions::new(dir.path().join("l.db")))
        .await
        .unwrap();
    let first = granted(&backend, "a", "o").await;
    for floor in [u64::MAX, i64::MAX as u64] {
        let refused = backend
            .try_acquire(&request("b", "o").with_min_token(Some(FencingToken(floor))))
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
    }
    // The refused floors neither took the key nor moved the counter.
    assert_eq!(
        granted(&backend, "b", "o").await,
        FencingToken(first.get() + 1)
    );
}

#[tokio::test]
async fn a_batch_naming_one_lease_twice_renews_it_and_touches_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::connect_with(SqliteOptions::new(dir.path().join("l.db")))
        .await
        .unwrap();
    let (key, owner) = (LockKey::new("k").unwrap(), Owner::new("o").unwrap());
    let token = granted(&backend, "k", "o").await;
    let other = granted(&backend, "other", "x").await;
    let lease = LeaseId::new(key.clone(), owner, token);
    let ttl = Duration::from_secs(900);
    let answers = backend
        .renew_many(&[Renewal::new(lease.clone(), ttl), Renewal::new(lease, ttl)])
        .await
        .unwrap();
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let info = backend.inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.token, token);
    assert!(info.expires_in > Duration::from_secs(600), "{info:?}");
    let untouched = backend
        .inspect(&LockKey::new("other").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(untouched.token, other);
    assert!(
        untouched.expires_in <= Duration::from_secs(600),
        "{untouched:?}"
    );
}

/// A database made before read-write locks (a fence table without
/// `writer_token`, no readers tables) is upgraded in place on open: its
/// admitted tokens count as writers', and readers work at once.
#[tokio::test]
async fn a_database_from_before_read_write_locks_is_upgraded_in_place() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("old.db");
    tamper(
        &path,
        "CREATE TABLE fencelock_fences (resource TEXT PRIMARY KEY, token TEXT NOT NULL) \
             WITHOUT ROWID;
         INSERT INTO fencelock_fences VALUES ('orders', '00000000000000000007');",
    );
    let fence = SqliteFence::connect_with(SqliteOptions::new(&path)).await?;
    assert_eq!(fence.highest_writer("orders").await?, Some(FencingToken(7)));
    let stale = fence
        .admit_shared("orders", FencingToken(6), fencelock_core::LockMode::Shared)
        .await;
    assert!(matches!(stale, Err(Error::Stale { current, .. }) if current == FencingToken(7)));
    fence
        .admit_shared("orders", FencingToken(8), fencelock_core::LockMode::Shared)
        .await?;
    assert_eq!(fence.highest("orders").await?, Some(FencingToken(8)));
    let backend = SqliteBackend::connect_with(SqliteOptions::new(&path)).await?;
    let reader = backend
        .try_acquire(&request("k", "r").with_mode(LockMode::Shared))
        .await?;
    assert!(matches!(reader, Acquire::Granted(_)), "{reader:?}");
    Ok(())
}

/// `admit_shared_in` takes part in the caller's transaction: a reader's
/// admission rolled back leaves no trace, a committed one raises the
/// highest token but not the writer's.
#[tokio::test]
async fn the_shared_admission_commits_and_rolls_back_with_the_callers_transaction() -> TestResult {
    use fencelock_core::LockMode::{Exclusive, Shared};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let mut conn = Connection::open(&path)?;
    ensure_schema(&conn)?;
    let fence = SqliteFence::connect_with(SqliteOptions::new(&path)).await?;
    fence
        .admit_shared("doc", FencingToken(5), Exclusive)
        .await?;
    let tx = conn.transaction()?;
    SqliteFence::admit_shared_in(&tx, "doc", FencingToken(9), Shared)?;
    tx.rollback()?;
    assert_eq!(fence.highest("doc").await?, Some(FencingToken(5)));
    let tx = conn.transaction()?;
    SqliteFence::admit_shared_in(&tx, "doc", FencingToken(9), Shared)?;
    assert!(matches!(
        SqliteFence::admit_shared_in(&tx, "doc", FencingToken(4), Shared),
        Err(Error::Stale { .. })
    ));
    tx.commit()?;
    assert_eq!(fence.highest("doc").await?, Some(FencingToken(9)));
    assert_eq!(fence.highest_writer("doc").await?, Some(FencingToken(5)));
    assert!(fence.admit("doc", FencingToken(8)).await.is_err());
    Ok(())
}

/// The counter's end is a typed error on the key asked for
/// (`fencelock_testkit::sql`): the counter stays at the last token (never
/// past it, never a REAL), and renewals and releases of held leases go on.
#[tokio::test]
async fn the_counters_end_is_a_typed_error_not_a_broken_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect_with(SqliteOptions::new(&path)).await?;
    let path = &path;
    fencelock_testkit::sql::the_counters_end_is_a_typed_error(
        &backend,
        |last| async move {
            tamper(
                path,
                &format!("UPDATE fencelock_counter SET last_token = {last}"),
            );
            Ok(())
        },
        || async move {
            let counter: i64 = Connection::open(path)?.query_row(
                "SELECT last_token FROM fencelock_counter",
                [],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(counter)?)
        },
    )
    .await
}
