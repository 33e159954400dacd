//! The embedded SQLite backend of fencelock: locks in one file, safe across
//! the processes of one host.
//!
//! - **Atomic acquisition.** Every write runs in a `BEGIN IMMEDIATE`
//!   transaction, which takes the database's single write lock before it
//!   reads, so the "is it free?" check and the write that takes the lease
//!   cannot interleave with another process's.
//! - **Tokens** come from one counter row that is never deleted, so they grow
//!   across release, expiry, takeover, cleanup and process restarts (I2).
//! - **Time** is the host's boot-time clock, which does not step, read the
//!   same in every Linux time namespace, with the boot id stored beside each
//!   lease so that leases from before a reboot count as expired (see
//!   `docs/semantics.md`, I4).
//! - **Wake-ups** reach waiters in the same process at once; waiters in other
//!   processes back off with jitter, never sleeping past the holder's expiry.
//!
//! The file must live on a local disk of the one host that uses it: SQLite's
//! locking is not reliable on network filesystems, and leases are judged by
//! that host's clock. Opening creates the file and its missing directories
//! (mode 0700).
//!
//! ```
//! use std::sync::Arc;
//! use fencelock_core::LockClient;
//! use fencelock_sqlite::{SqliteBackend, SqliteOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fencelock_core::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("locks.db");
//! let backend = SqliteBackend::connect_with(SqliteOptions::new(&path)).await?;
//! let client = LockClient::new(Arc::new(backend));
//! let guard = client.lock("nightly-report").acquire().await?;
//! println!("token {}", guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod clock;
mod connection;
mod error;
mod fence;
mod options;

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{Backend, Driver, Fence, Result};

pub use backend::SqliteBackend;
pub use connection::ensure_schema;
pub use fence::SqliteFence;
pub use options::{SqliteOptions, Synchronous};

/// The [`Driver`] of `sqlite://PATH` URLs (see [`SqliteOptions::from_url`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteDriver;

#[async_trait]
impl Driver for SqliteDriver {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["sqlite"]
    }

    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(SqliteBackend::connect(url).await?))
    }

    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>> {
        Ok(Arc::new(SqliteFence::connect(url).await?))
    }

    #[cfg(feature = "baseline")]
    async fn open_baseline(
        &self,
        url: &str,
    ) -> Result<Box<dyn fencelock_core::baseline::RawBaseline>> {
        baseline::open(url).await
    }
}
