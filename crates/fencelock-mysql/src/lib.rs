//! MySQL / MariaDB backend and fence for fencelock: MariaDB 10.6+ and
//! MySQL 8.0.17+ in one SQL dialect (tested on MariaDB, also in MySQL 8's
//! default `sql_mode`; `docs/mysql.md` says what rests on which construct).
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = fencelock_mysql::MySqlBackend::connect("mariadb://app@db.internal/app").await?;
//! let client = fencelock_core::LockClient::new(std::sync::Arc::new(backend));
//! let guard = client.lock("order:1").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Acquisition is one `INSERT … ON DUPLICATE KEY UPDATE` whose conditional
//! assignments only take over an expired row, with tokens from a counter
//! row advanced with `LAST_INSERT_ID(expr)` under the key's named lock;
//! every decision uses the server's `NOW(6)`. There is no server push, so
//! waiters back off with jitter, bounded by the holder's remaining lease
//! (returned with every refusal). TLS (rustls) is behind the `tls` feature.

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod error;
mod fence;
mod options;
mod schema;

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{Backend, Driver, Fence, Result};

pub use backend::MySqlBackend;
pub use fence::MySqlFence;
pub use options::MySqlOptions;

/// The [`Driver`] of this crate's URLs (see [`MySqlOptions::from_url`]).
/// Malformed URLs are [`fencelock_core::Error::InvalidUrl`], without the
/// password.
#[derive(Clone, Copy, Debug, Default)]
pub struct MySqlDriver;

#[async_trait]
impl Driver for MySqlDriver {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn schemes(&self) -> &'static [&'static str] {
        options::SCHEMES
    }

    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(MySqlBackend::connect(url).await?))
    }

    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>> {
        Ok(Arc::new(MySqlFence::connect(url).await?))
    }

    #[cfg(feature = "baseline")]
    async fn open_baseline(
        &self,
        url: &str,
    ) -> Result<Box<dyn fencelock_core::baseline::RawBaseline>> {
        baseline::open(url).await
    }
}
