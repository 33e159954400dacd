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
//! | `mysql://user:pw@host/db`, `mariadb://…` | `mysql` | MariaDB 10.6+, MySQL 8.0.17+ |
//! | `redis://:pw@host:6379/0`, `rediss://…` | `redis` (+`tls`) | Redis 6.2+ |
//! | `redis+cluster://h1:p1,h2:p2`, `rediss+cluster://…` | `redis` (+`tls`) | Redis Cluster |
//! | `redis+sentinel://h1:p1,h2:p2/MASTER`, `rediss+sentinel://…` | `redis` (+`tls`) | Redis with Sentinel failover |
//! | `redlock://h1:6379,h2:6379,h3:6379` | `redlock` | a majority of independent Redis 6.2+ servers |
//! | `etcd://host:2379[,host:2379…]` | `etcd` | etcd v3 (3.4+) |
//! | `etcd://host:2379?layout=etcd` | `etcd` | etcd v3, locks shared with `etcdctl lock`/`elect` and Go's `concurrency` package |
//! | `zk://host:2181[,host:2181…][/chroot]` | `zookeeper` | ZooKeeper 3.6+ |
//! | `http://[:TOKEN@]host:port`, `https://…` | `http` | a `fencelock serve` lock service |
//! | `mem://` | always | in-process, for tests |
//! | `sharded:///path/shards.toml` | `sharded` | named shards over the backends above |
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
//!   owner name or [`ClockPolicy`]; [`open_backend_within`] to ride through
//!   a failover in progress while opening, as `fencelock run --wait` does);
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
//! - [`metrics`] names what the library records;
//! - [`LockClient::election`] gives an [`Election`]: `campaign` for a
//!   [`Leadership`] whose term is a fencing token, `leader`, `observe`
//!   (a [`LeaderWatch`] of [`LeaderChange`]s, expiries included) and `run`
//!   (`docs/election.md`); [`LockClient::watch`] follows any key on every
//!   backend; [`LockClient::validate`] and [`LockClient::resume`] check and
//!   re-attach to a lease by its token (`docs/reentry.md`);
//! - [`HeldLease`] holds a lock or a leadership behind one type, for code
//!   that hands either out as the same object.
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

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

// Compiles the Rust examples of the README and of docs/*.md as doctests,
// each with the features it needs.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/semaphore.md")]
mod semaphore_md {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/multi-key.md")]
mod multi_key_md {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/lock-delay.md")]
mod lock_delay_md {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/election.md")]
mod election_md {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/reentry.md")]
mod reentry_md {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/rwlock.md")]
mod rwlock_md {}
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../../../docs/postgres.md")]
mod postgres_md {}
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/redis.md")]
mod redis_md {}
#[cfg(all(doctest, feature = "redlock"))]
#[doc = include_str!("../../../docs/redlock.md")]
mod redlock_md {}
#[cfg(all(doctest, feature = "etcd"))]
#[doc = include_str!("../../../docs/etcd.md")]
mod etcd_md {}
#[cfg(all(doctest, feature = "zookeeper"))]
#[doc = include_str!("../../../docs/zookeeper.md")]
mod zookeeper_md {}

pub use fencelock_core::*;

mod held;
pub use held::HeldLease;

/// What a storage engine implements and uses, for backend authors:
/// applications need none of it. Each item is also at the crate root.
pub mod backend {
    pub use fencelock_core::{
        async_trait, renew_alone, renew_each_mode, renew_one_by_one, renew_writers_batched,
        Acquire, AcquireRequest, Backend, BackendAdmin, BackendError, Backoff, Capabilities,
        Driver, ErrorStatus, FairQueue, Grant, HolderChange, Renewal, Stats, WakeHub,
        WakeSubscription, Watch, WatchFeeder, WriteIntents,
    };
}

/// The etcd backend's own API (options, fence).
#[cfg(feature = "etcd")]
pub use fencelock_etcd as etcd;
/// The `http://` backend's own API (the lock service's wire types).
#[cfg(feature = "http")]
pub use fencelock_http as http;
/// The MySQL/MariaDB backend's own API (options, in-transaction fence).
#[cfg(feature = "mysql")]
pub use fencelock_mysql as mysql;
/// The PostgreSQL backend's own API (options, in-transaction fence).
#[cfg(feature = "postgres")]
pub use fencelock_postgres as postgres;
/// The Redis backend's own API (options, fence).
#[cfg(feature = "redis")]
pub use fencelock_redis as redis;
/// The Redlock backend's own API (options).
#[cfg(feature = "redlock")]
pub use fencelock_redlock as redlock;
/// The sharded backend's own API (shard maps, resharding).
#[cfg(feature = "sharded")]
pub use fencelock_sharded as sharded;
/// The SQLite backend's own API (options, in-transaction fence).
#[cfg(feature = "sqlite")]
pub use fencelock_sqlite as sqlite;
/// The ZooKeeper backend's own API (options, fence).
#[cfg(feature = "zookeeper")]
pub use fencelock_zookeeper as zookeeper;

/// Every driver compiled in, memory first. Adding an engine adds a line
/// here and a cargo feature, nothing else.
pub fn drivers() -> Vec<&'static dyn Driver> {
    #[allow(unused_mut)] // with no backend feature, only memory is listed
    let mut drivers: Vec<&'static dyn Driver> = vec![&MemoryDriver];
    #[cfg(feature = "sqlite")]
    drivers.push(&fencelock_sqlite::SqliteDriver);
    #[cfg(feature = "postgres")]
    drivers.push(&fencelock_postgres::PostgresDriver);
    #[cfg(feature = "mysql")]
    drivers.push(&fencelock_mysql::MySqlDriver);
    #[cfg(feature = "redis")]
    drivers.push(&fencelock_redis::RedisDriver);
    #[cfg(feature = "redlock")]
    drivers.push(&fencelock_redlock::RedlockDriver);
    #[cfg(feature = "etcd")]
    drivers.push(&fencelock_etcd::EtcdDriver);
    #[cfg(feature = "zookeeper")]
    drivers.push(&fencelock_zookeeper::ZkDriver);
    #[cfg(feature = "http")]
    drivers.push(&fencelock_http::HttpDriver);
    #[cfg(feature = "sharded")]
    drivers.push(&SHARDED);
    drivers
}

/// `sharded://` maps open their shards through this crate's own URL
/// dispatch, so that the sharded crate depends on no backend crate (and
/// this crate on it without a cycle). The map refuses `sharded://` shards,
/// so the recursion is one level deep.
#[cfg(feature = "sharded")]
static SHARDED: fencelock_sharded::ShardedDriver =
    fencelock_sharded::ShardedDriver::new(|url| Box::pin(async move { open_backend(&url).await }));

/// The schemes of engines this build can be given a feature for, and the
/// feature: to say which feature a URL needs when it is off.
const FEATURES: &[(&str, &str)] = &[
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis"),
    ("redis+sentinel", "redis"),
    ("rediss+sentinel", "redis"),
    ("redlock", "redlock"),
    ("etcd", "etcd"),
    ("zk", "zookeeper"),
    ("http", "http"),
    ("https", "http"),
    ("sharded", "sharded"),
];

/// The driver for `url`'s scheme (case-insensitive), and `url` with its
/// scheme in lower case (the backends parse only that form).
fn driver_for(url: &str) -> Result<(&'static dyn Driver, String)> {
    let Some((scheme, rest)) = url.split_once("://").filter(|(s, _)| !s.is_empty()) else {
        return Err(Error::InvalidUrl(missing_slashes(url).unwrap_or_else(
            || {
                format!(
                    "{:?} has no scheme; expected e.g. sqlite:///path/locks.db",
                    redact_url(url)
                )
            },
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    let drivers = drivers();
    if let Some(driver) = drivers
        .iter()
        .find(|d| d.schemes().contains(&scheme.as_str()))
    {
        return Ok((*driver, format!("{scheme}://{rest}")));
    }
    if let Some((_, feature)) = FEATURES.iter().find(|(s, _)| *s == scheme) {
        return Err(Error::Unsupported(format!(
            "this URL needs fencelock's `{feature}` cargo feature"
        )));
    }
    let known: Vec<&str> = drivers
        .iter()
        .flat_map(|d| d.schemes().iter().copied())
        .collect();
    Err(Error::InvalidUrl(format!(
        "unknown scheme {scheme:?}; known: {}",
        known.join(", ")
    )))
}

/// The reason for `scheme:rest`, a known scheme without the `//` (such as
/// `sqlite:locks.db`): it is refused rather than guessed at, since what
/// follows the colon could be a path or a host, but the message says how to
/// write it.
fn missing_slashes(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once(':')?;
    let scheme = scheme.to_ascii_lowercase();
    if !FEATURES.iter().any(|(s, _)| *s == scheme) {
        return None;
    }
    Some(if scheme == "sqlite" {
        let path = rest.trim_start_matches('/');
        format!(
            "a sqlite URL needs `//` after the colon: sqlite://{path} for a path relative \
             to the working directory, sqlite:///{path} for /{path}"
        )
    } else {
        format!(
            "a {scheme} URL needs `//` after the colon, e.g. {scheme}://{}",
            redact_url(rest)
        )
    })
}

/// Opens the backend a URL names.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    let (driver, url) = driver_for(url)?;
    driver.open_backend(&url).await
}

/// Opens the backend a URL names as a caller willing to wait does: failures
/// the backend calls transient ([`Error::is_transient`]: no answer, refused
/// connections, a cluster between leaders, too many connections) are
/// retried with backoff for up to `wait` (`Duration::MAX`: until it opens),
/// so that a process started during a failover rides through it as its
/// waits do. Each attempt is bounded by the backend's own connect timeout,
/// so this ends within `wait` plus that timeout even if nothing answers;
/// other errors (a bad URL, refused credentials) are answered at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use std::time::Duration;
///
/// let backend = fencelock::open_backend_within("mem://", Duration::from_secs(30)).await?;
/// assert_eq!(backend.name(), "memory");
/// # Ok(())
/// # }
/// ```
pub async fn open_backend_within(url: &str, wait: Duration) -> Result<Arc<dyn Backend>> {
    let deadline = Instant::now().checked_add(wait);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match open_backend(url).await {
            Err(e) if e.is_transient() => {
                let left = deadline.map_or(Duration::MAX, |d| {
                    d.saturating_duration_since(Instant::now())
                });
                if left.is_zero() {
                    return Err(e);
                }
                tracing::debug!(error = %e, "cannot open the backend yet; retrying");
                // The last try is at the deadline itself.
                tokio::time::sleep(backoff.next_pause().min(left)).await;
            }
            result => return result,
        }
    }
}

/// Opens the fence kept by the backend a URL names.
pub async fn open_fence(url: &str) -> Result<Arc<dyn Fence>> {
    let (driver, url) = driver_for(url)?;
    driver.open_fence(&url).await
}

/// The engine's own limit for `fencelock bench --baseline`: raw lock
/// cycles on the engine a URL names, configured as its backend. Not a
/// stable API.
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub async fn open_baseline(url: &str) -> Result<Box<dyn baseline::RawBaseline>> {
    let (driver, url) = driver_for(url)?;
    driver.open_baseline(&url).await
}

/// A [`LockClient`] with default settings on the backend a URL names.
pub async fn connect(url: &str) -> Result<LockClient> {
    Ok(LockClient::new(open_backend(url).await?))
}
