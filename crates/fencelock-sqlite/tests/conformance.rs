//! The conformance suite against SQLite: each case gets its own database
//! file; every `connect` opens a new connection to it, as another process
//! would.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

use std::{process::ExitCode, sync::Arc};

use fencelock_core::{Backend, Fence};
use fencelock_sqlite::{SqliteBackend, SqliteFence, SqliteOptions};
use fencelock_testkit::{async_trait, Store, StoreFactory, TestResult};

struct Sqlite;

struct SqliteStore {
    // Removes the database when the case ends.
    _dir: tempfile::TempDir,
    options: SqliteOptions,
}

#[async_trait]
impl Store for SqliteStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(
            SqliteBackend::connect_with(self.options.clone()).await?,
        ))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(
            SqliteFence::connect_with(self.options.clone()).await?,
        )))
    }
}

#[async_trait]
impl StoreFactory for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }
    fn can_restart(&self) -> bool {
        // An embedded database has no server to restart; a new process
        // opening the file is `tokens::i2_grow_across_reconnect`, and the CLI
        // tests run real separate processes.
        false
    }
    fn has_fence(&self) -> bool {
        true
    }
    async fn store(&self, _dedicated: bool) -> TestResult<Box<dyn Store>> {
        let dir = tempfile::tempdir()?;
        let options = SqliteOptions::new(dir.path().join("locks.db"));
        Ok(Box::new(SqliteStore { _dir: dir, options }))
    }
}

fn main() -> ExitCode {
    fencelock_testkit::run(Sqlite)
}
