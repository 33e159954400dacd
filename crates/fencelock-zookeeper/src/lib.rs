//! ZooKeeper backend (and fence) for [fencelock](fencelock_core).
//!
//! - Each key is a container node; a lease is a sequential child node
//!   (`l-0000000042`) holding its owner, kind, data and TTL. The oldest
//!   unexpired child holds the key. Acquire creates a child, deletes older
//!   children whose leases have ended (each delete conditional on the
//!   version it judged) and withdraws its own child if an older one is
//!   still live.
//! - The fencing token is the node's **creation zxid** (`czxid`): ordered
//!   across the whole ensemble, never reused, unaffected by the key's
//!   parent being deleted and recreated, restarts or leader changes. The
//!   sequence number is not a token: it restarts at 0 in a new parent. A
//!   zxid cannot be raised to a floor, so `min_token` is not offered.
//! - A lease ends at the node's `mtime` plus its TTL: the leader's clock
//!   at the grant or last renewal (I4). Renew and release are writes
//!   conditional on the node's version, and refuse a lease that had ended
//!   by the time they were written. Leases are not ZooKeeper sessions
//!   (`docs/zookeeper.md` says why).
//! - Waiters watch the oldest child for deletion; renewals do not wake them.
//!   `changes` follows the whole store with one persistent recursive watch
//!   of the locks directory, in a session of its own.
//! - Read-write locks: a reader is an `r-` sibling in the same sequence,
//!   refused by an older live writer's node or a live writer intent (the
//!   `intent` node); a writer is refused by any older live node. The
//!   fence keeps the highest writer token beside the highest token.
//! - `?layout=curator` ([`ZkLayout::Curator`]): the key is a path, and
//!   contenders are named as Curator's `InterProcessMutex` and
//!   `LeaderLatch` name theirs, so that Curator's and kazoo's holders and
//!   fencelock's exclude each other; a foreign node is held until it is
//!   deleted, and fencelock never deletes one.
//!
//! See `docs/zookeeper.md`.

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod changes;
mod conn;
mod curator;
mod error;
mod fence;
mod options;
mod queue;

use std::sync::Arc;

use async_trait::async_trait;

pub use backend::ZkBackend;
pub use fence::ZkFence;
pub use options::{ZkBalance, ZkLayout, ZkOptions, DEFAULT_PREFIX};

/// Opens ZooKeeper backends and fences from
/// `zk://host:port[,host:port…][/chroot]` URLs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZkDriver;

#[async_trait]
impl fencelock_core::Driver for ZkDriver {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["zk"]
    }

    async fn open_backend(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
        Ok(Arc::new(ZkBackend::connect(url).await?))
    }

    async fn open_fence(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
        Ok(Arc::new(ZkFence::connect(url).await?))
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
            |url| Box::pin(async move { super::ZkDriver.open_backend(&url).await }),
            |url| Box::pin(async move { super::ZkDriver.open_fence(&url).await }),
            &["zk://user:s3cret@host:2181", "redis://user:s3cret@h:1"],
            "s3cret",
        )
        .await
    }
}
