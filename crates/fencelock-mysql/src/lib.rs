//! MySQL / MariaDB backend and fence for fencelock (MariaDB 10.6+ tested;
//! MySQL 8 differences in `docs/mysql.md`).
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = fencelock_mysql::open_backend("mariadb://app@db.internal/app").await?;
//! let client = fencelock_core::LockClient::new(backend);
//! let guard = client.lock("order:1").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Acquisition is one `INSERT … ON DUPLICATE KEY UPDATE` whose conditional
//! assignments only take over an expired row, with tokens from a sequence;
//! every decision uses the server's `NOW(6)`. There is no server push, so
//! waiters back off with jitter, bounded by the holder's remaining lease
//! (returned with every refusal). TLS (rustls) is behind the `tls` feature.

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod error;
mod fence;
mod schema;

use std::sync::Arc;

pub use backend::{MySqlBackend, MySqlOptions};
pub use fence::MySqlFence;

/// Opens a [`MySqlBackend`] for a `mysql://` or `mariadb://` URL. Malformed
/// URLs are [`fencelock_core::Error::InvalidUrl`], without the password.
pub async fn open_backend(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
    Ok(Arc::new(MySqlBackend::connect(url).await?))
}

/// Opens a [`MySqlFence`] for the same kind of URL.
pub async fn open_fence(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
    Ok(Arc::new(MySqlFence::connect(url).await?))
}
