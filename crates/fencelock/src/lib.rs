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
//! | `postgres://user:pw@host/db` | `postgres` | PostgreSQL 12+ |
//! | `mysql://user:pw@host/db`, `mariadb://…` | `mysql` | MariaDB 10.6+ (MySQL 8: see docs) |
//! | `redis://:pw@host:6379/0`, `rediss://…` | `redis` (+`tls`) | Redis 6.2+ |
//! | `etcd://host:2379[,host:2379…]` | `etcd` | etcd v3 (3.4+) |
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

/// The etcd backend's own API (options, fence).
#[cfg(feature = "etcd")]
pub use fencelock_etcd as etcd;
/// The MySQL/MariaDB backend's own API (options, in-transaction fence).
#[cfg(feature = "mysql")]
pub use fencelock_mysql as mysql;
/// The PostgreSQL backend's own API (options, in-transaction fence).
#[cfg(feature = "postgres")]
pub use fencelock_postgres as postgres;
/// The Redis backend's own API (options, fence).
#[cfg(feature = "redis")]
pub use fencelock_redis as redis;
/// The SQLite backend's own API (options, in-transaction fence).
#[cfg(feature = "sqlite")]
pub use fencelock_sqlite as sqlite;

/// The engines a URL can name.
#[derive(Clone, Copy, Debug)]
enum Engine {
    Memory,
    Sqlite,
    Postgres,
    MySql,
    Redis,
    Etcd,
}

impl Engine {
    /// Reads the scheme (the text before `://`, case-insensitive).
    fn of(url: &str) -> Result<Self> {
        let Some((scheme, _)) = url.split_once("://").filter(|(s, _)| !s.is_empty()) else {
            return Err(Error::InvalidUrl(format!(
                "{:?} has no scheme; expected e.g. sqlite:///path/locks.db",
                redact_url(url)
            )));
        };
        Ok(match scheme.to_ascii_lowercase().as_str() {
            "mem" | "memory" => Engine::Memory,
            "sqlite" => Engine::Sqlite,
            "postgres" | "postgresql" => Engine::Postgres,
            "mysql" | "mariadb" => Engine::MySql,
            "redis" | "rediss" => Engine::Redis,
            "etcd" => Engine::Etcd,
            other => {
                return Err(Error::InvalidUrl(format!(
                    "unknown scheme {other:?}; known: mem, sqlite, postgres, postgresql, mysql, \
                     mariadb, redis, rediss, etcd"
                )))
            }
        })
    }

    /// The error for an engine whose cargo feature was not compiled in.
    #[allow(dead_code)] // unused when every backend feature is on
    fn not_compiled(self) -> Error {
        let feature = match self {
            Engine::Memory => "(none)",
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
            Engine::MySql => "mysql",
            Engine::Redis => "redis",
            Engine::Etcd => "etcd",
        };
        Error::Unsupported(format!(
            "this URL needs fencelock's `{feature}` cargo feature"
        ))
    }
}

/// `url` with its scheme in lower case: schemes are case-insensitive, and
/// the backends parse only the lower-case form.
fn lower_scheme(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => url.to_owned(),
    }
}

/// Opens the backend a URL names.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    let url = &lower_scheme(url);
    match Engine::of(url)? {
        Engine::Memory => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => fencelock_sqlite::open_backend(url).await,
        #[cfg(feature = "postgres")]
        Engine::Postgres => fencelock_postgres::open_backend(url).await,
        #[cfg(feature = "mysql")]
        Engine::MySql => fencelock_mysql::open_backend(url).await,
        #[cfg(feature = "redis")]
        Engine::Redis => fencelock_redis::open_backend(url).await,
        #[cfg(feature = "etcd")]
        Engine::Etcd => fencelock_etcd::open_backend(url).await,
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled()),
    }
}

/// Opens the fence kept by the backend a URL names.
pub async fn open_fence(url: &str) -> Result<Arc<dyn Fence>> {
    let url = &lower_scheme(url);
    match Engine::of(url)? {
        Engine::Memory => Ok(Arc::new(MemoryFence::new())),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => fencelock_sqlite::open_fence(url).await,
        #[cfg(feature = "postgres")]
        Engine::Postgres => fencelock_postgres::open_fence(url).await,
        #[cfg(feature = "mysql")]
        Engine::MySql => fencelock_mysql::open_fence(url).await,
        #[cfg(feature = "redis")]
        Engine::Redis => fencelock_redis::open_fence(url).await,
        #[cfg(feature = "etcd")]
        Engine::Etcd => fencelock_etcd::open_fence(url).await,
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled()),
    }
}

/// The engine's own limit for `fencelock bench --baseline`: raw lock
/// cycles on the engine a URL names, configured as its backend. Not a
/// stable API.
#[doc(hidden)]
pub async fn open_baseline(url: &str) -> Result<Box<dyn baseline::RawBaseline>> {
    let url = &lower_scheme(url);
    match Engine::of(url)? {
        Engine::Memory => Ok(Box::new(baseline::DirectBaseline::new(
            open_backend(url).await?,
        )?)),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => fencelock_sqlite::baseline::open(url).await,
        #[cfg(feature = "postgres")]
        Engine::Postgres => fencelock_postgres::baseline::open(url).await,
        #[cfg(feature = "mysql")]
        Engine::MySql => fencelock_mysql::baseline::open(url).await,
        #[cfg(feature = "redis")]
        Engine::Redis => fencelock_redis::baseline::open(url).await,
        #[cfg(feature = "etcd")]
        Engine::Etcd => fencelock_etcd::baseline::open(url).await,
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled()),
    }
}

/// A [`LockClient`] with default settings on the backend a URL names.
pub async fn connect(url: &str) -> Result<LockClient> {
    Ok(LockClient::new(open_backend(url).await?))
}
