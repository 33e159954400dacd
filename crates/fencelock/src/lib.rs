//! **fencelock**: distributed locks whose every grant carries a fencing token.
//!
//! Leases expire on the backend's clock, guards renew them in the background
//! and signal loudly when they are lost, and every grant's token is larger
//! than any token issued for that key before, so a protected resource can
//! refuse a holder that was paused or partitioned past its lease (see
//! [`Fence`]).
//!
//! This crate is the front door: it opens backends by URL and re-exports
//! the whole core API. Each backend is a cargo feature:
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
//! `tls` adds TLS to every enabled server backend.
//!
//! # Example
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
//!
//! # For applications
//!
//! - [`connect`] a [`LockClient`] to the backend a URL names (or
//!   [`open_backend`] and [`LockClient::builder`] for settings such as the
//!   owner name or [`ClockPolicy`]);
//! - [`LockClient::lock`] gives a [`LockRequest`] (TTL, wait, kind, data),
//!   whose `acquire` returns a [`LockGuard`]: renewed in the background,
//!   [`check`](GuardHandle::check)ed before writes, [`lost`](GuardHandle::lost)
//!   when the lease can no longer be trusted, carrying the grant's
//!   [`FencingToken`]; `run` and `with_lock` cancel the work on loss;
//! - [`open_fence`] gives the [`Fence`] a protected resource uses to refuse
//!   stale tokens ([`Admission`]); the SQL backends' modules also offer
//!   fences that admit inside your own transaction;
//! - [`Error`] is the one error type; [`Error::is_transient`] says whether
//!   a retry could help, and [`LossReason`] why a lock was lost;
//! - [`metrics`] names what the library records.
//!
//! The guarantees (I1–I7) and how each backend keeps them are described in
//! `docs/semantics.md` and `docs/<backend>.md` of the repository.
//!
//! # For backend authors
//!
//! The [`backend`] module gathers what a storage engine implements and
//! uses: the [`Backend`] trait, [`Capabilities`], [`AcquireRequest`],
//! [`Acquire`], [`Grant`], [`Stats`], [`WakeHub`] and [`Backoff`]. The
//! same items are also re-exported at the crate root.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

// Compiles the Rust examples of the README and of docs/*.md as doctests,
// each with the features it needs.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../../../docs/postgres.md")]
mod postgres_md {}
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/redis.md")]
mod redis_md {}
#[cfg(all(doctest, feature = "etcd"))]
#[doc = include_str!("../../../docs/etcd.md")]
mod etcd_md {}

pub use fencelock_core::*;

/// What a storage engine implements and uses, for backend authors:
/// applications need none of it. Each item is also at the crate root.
pub mod backend {
    pub use fencelock_core::{
        async_trait, Acquire, AcquireRequest, Backend, Backoff, Capabilities, Grant, Stats,
        WakeHub, WakeSubscription,
    };
}

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
#[cfg(feature = "baseline")]
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
