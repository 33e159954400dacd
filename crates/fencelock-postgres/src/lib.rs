//! PostgreSQL (12+) backend and fence for fencelock.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = fencelock_postgres::open_backend(
//!     "postgres://app@db.internal/app?table_prefix=fencelock_",
//! ).await?;
//! let client = fencelock_core::LockClient::new(backend);
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
mod schema;

use std::sync::Arc;

pub use backend::{PostgresBackend, PostgresOptions};
pub use fence::PostgresFence;

/// Opens a [`PostgresBackend`] for a `postgres://` or `postgresql://` URL.
/// Malformed URLs are [`fencelock_core::Error::InvalidUrl`], without the
/// password.
pub async fn open_backend(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
    Ok(Arc::new(PostgresBackend::connect(url).await?))
}

/// Opens a [`PostgresFence`] for the same kind of URL.
pub async fn open_fence(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
    Ok(Arc::new(PostgresFence::connect(url).await?))
}
