//! PostgreSQL (12+) backend and fence for fencelock.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = fencelock_postgres::PostgresBackend::connect(
//!     "postgres://app@db.internal/app?table_prefix=fencelock_",
//! ).await?;
//! let client = fencelock_core::LockClient::new(std::sync::Arc::new(backend));
//! let guard = client.lock("order:1").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Every operation is one autocommit statement decided by the server's
//! clock; tokens come from a sequence; releases wake waiters through
//! `LISTEN/NOTIFY`. `docs/postgres.md` explains the schema, the statements,
//! durability and the driver choice. TLS (rustls) is behind the `tls`
//! feature; use `sslmode=require` in the URL.

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod error;
mod fence;
mod listener;
mod options;
mod schema;

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{Backend, Driver, Fence, Result};

pub use backend::PostgresBackend;
pub use fence::PostgresFence;
pub use options::PostgresOptions;

/// The [`Driver`] of this crate's URLs (see [`PostgresOptions::from_url`]).
/// Malformed URLs are [`fencelock_core::Error::InvalidUrl`], without the
/// password.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostgresDriver;

#[async_trait]
impl Driver for PostgresDriver {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn schemes(&self) -> &'static [&'static str] {
        options::SCHEMES
    }

    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(PostgresBackend::connect(url).await?))
    }

    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>> {
        Ok(Arc::new(PostgresFence::connect(url).await?))
    }

    #[cfg(feature = "baseline")]
    async fn open_baseline(
        &self,
        url: &str,
    ) -> Result<Box<dyn fencelock_core::baseline::RawBaseline>> {
        baseline::open(url).await
    }
}
