//! **fencelock**: distributed locks whose every grant carries a fencing token.
//!
//! Leases expire on the backend's clock, guards renew them in the background
//! and signal loudly when they are lost, and every grant's token is larger
//! than any token issued for that key before, so a protected resource can
//! refuse a holder that was paused or partitioned past its lease (see
//! [`Fence`]).
//!
//! This crate is the front door: it re-exports the core API and opens
//! backends by URL. Each backend is a cargo feature:
//!
//! | URL | feature | backend |
//! |---|---|---|
//! | `sqlite:///path/locks.db` | `sqlite` (default) | embedded, one host |
//! | `mem://` | always | in-process, for tests |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fencelock::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = format!("sqlite://{}", dir.path().join("locks.db").display());
//! let client = fencelock::connect(&url).await?;
//! let guard = client
//!     .lock("order:123")
//!     .ttl(std::time::Duration::from_secs(30))
//!     .acquire()
//!     .await?;
//! // Present guard.token() to the protected resource with every write.
//! guard.check()?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

// Compiles the README's Rust examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}

pub use fencelock_core::*;

/// The SQLite backend's own API (options, in-transaction fence).
#[cfg(feature = "sqlite")]
pub use fencelock_sqlite as sqlite;

/// The scheme of `url` (the text before `://`), lower-cased.
fn scheme(url: &str) -> Result<String> {
    match url.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() => Ok(scheme.to_ascii_lowercase()),
        _ => Err(Error::InvalidUrl(format!(
            "{:?} has no scheme; expected e.g. sqlite:///path/locks.db",
            redact_url(url)
        ))),
    }
}

/// An error for a scheme whose cargo feature was not compiled in.
#[allow(dead_code)] // unused when every backend feature is on
fn not_compiled(scheme: &str, feature: &str) -> Error {
    Error::Unsupported(format!(
        "{scheme}:// URLs need fencelock's `{feature}` cargo feature"
    ))
}

fn unknown(scheme: &str) -> Error {
    Error::InvalidUrl(format!(
        "unknown scheme {scheme:?}; known: mem, sqlite, postgres, postgresql, mysql, mariadb, \
         redis, rediss, etcd"
    ))
}

/// Opens the backend a URL names.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    match scheme(url)?.as_str() {
        "mem" | "memory" => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => fencelock_sqlite::open_backend(url).await,
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(not_compiled("sqlite", "sqlite")),
        "postgres" | "postgresql" => Err(not_compiled("postgres", "postgres")),
        "mysql" | "mariadb" => Err(not_compiled("mysql", "mysql")),
        "redis" | "rediss" => Err(not_compiled("redis", "redis")),
        "etcd" => Err(not_compiled("etcd", "etcd")),
        other => Err(unknown(other)),
    }
}

/// Opens the fence kept by the backend a URL names.
pub async fn open_fence(url: &str) -> Result<Arc<dyn Fence>> {
    match scheme(url)?.as_str() {
        "mem" | "memory" => Ok(Arc::new(MemoryFence::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => fencelock_sqlite::open_fence(url).await,
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(not_compiled("sqlite", "sqlite")),
        "postgres" | "postgresql" => Err(not_compiled("postgres", "postgres")),
        "mysql" | "mariadb" => Err(not_compiled("mysql", "mysql")),
        "redis" | "rediss" => Err(not_compiled("redis", "redis")),
        "etcd" => Err(not_compiled("etcd", "etcd")),
        other => Err(unknown(other)),
    }
}

/// A [`LockClient`] with default settings on the backend a URL names.
pub async fn connect(url: &str) -> Result<LockClient> {
    Ok(LockClient::new(open_backend(url).await?))
}
