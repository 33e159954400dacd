//! Redis backend and fence for [fencelock](fencelock_core).
//!
//! - Every operation is one Lua script (EVALSHA, loaded once, NOSCRIPT
//!   handled by reloading), so it is one round trip and atomic.
//! - Leases are hashes with a `PX` expiry: Redis's clock decides expiry (I4).
//! - Tokens come from a per-key counter that is seeded from the server's
//!   `TIME` in microseconds when missing, so they keep growing across a
//!   restart without persistence (I2), given a server clock that does not
//!   step back.
//! - Keys of one lock share a hash tag (`PREFIX:{KEY}`,
//!   `PREFIX:{KEY}:token`), so each script touches one Cluster slot: the
//!   same scripts run on a Redis Cluster (`redis+cluster://h1:p1,h2:p2`).
//! - Releases publish on the key's own channel (`PREFIX:{KEY}:released`),
//!   which a backend subscribes to only while it has a waiter for that key.
//!
//! See `docs/redis.md` for the key layout, clock assumptions and Cluster
//! support.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = std::sync::Arc::new(
//!     fencelock_redis::RedisBackend::connect("redis://127.0.0.1:6379/0?prefix=myapp").await?,
//! );
//! let client = fencelock_core::LockClient::new(backend);
//! let guard = client.lock("job:1").acquire().await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod cluster;
mod conn;
mod error;
mod fence;
mod follow;
mod keys;
mod options;
mod scripts;
mod sentinel;
mod wakeups;

use std::sync::Arc;

use async_trait::async_trait;

pub use backend::RedisBackend;

/// Building blocks for backends that run scripts of their own over this
/// crate's key and lease layout on one or several Redis servers (the
/// `redlock` backend): the bounded connection, script calls with NOSCRIPT
/// handling, key names, the Lua helpers and the parsing of their answers,
/// and the mapping of driver errors.
pub mod node {
    pub use crate::backend::{
        field, from_value, label_and_data, ms_to_time, parse_describe, parse_token, ttl_ms,
    };
    pub use crate::conn::BoundedConnection;
    pub use crate::error::{bad_reply, map as map_error};
    pub use crate::keys::{Keys, Tagged};
    pub use crate::scripts::{Call, DESCRIBE as LUA_HELPERS};
}
pub use fence::RedisFence;
pub use options::{RedisOptions, DEFAULT_PREFIX};

/// Opens Redis backends and fences from `redis://` (with the `tls` feature
/// also `rediss://`) URLs, Redis Clusters from `redis+cluster://h1:p1,h2:p2`
/// (`rediss+cluster://`) URLs, and the master of a Sentinel set from
/// `redis+sentinel://h1:p1,h2:p2/MASTER_NAME` (`rediss+sentinel://`) URLs.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedisDriver;

#[async_trait]
impl fencelock_core::Driver for RedisDriver {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &[
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ]
    }

    async fn open_backend(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
        Ok(Arc::new(RedisBackend::connect(url).await?))
    }

    async fn open_fence(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
        Ok(Arc::new(RedisFence::connect(url).await?))
    }

    #[cfg(feature = "baseline")]
    async fn open_baseline(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Box<dyn fencelock_core::baseline::RawBaseline>> {
        baseline::open(url).await
    }
}

#[cfg(test)]
mod tests {
    use fencelock_core::Driver;

    #[tokio::test]
    async fn entry_points_refuse_malformed_urls_without_echoing_the_password(
    ) -> fencelock_testkit::TestResult {
        fencelock_testkit::servers::url_factory::assert_invalid_urls_hide(
            |url| Box::pin(async move { super::RedisDriver.open_backend(&url).await }),
            |url| Box::pin(async move { super::RedisDriver.open_fence(&url).await }),
            &["redis://user:s3cret@[::1", "postgres://user:s3cret@h/db"],
            "s3cret",
        )
        .await
    }
}
