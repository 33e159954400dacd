//! etcd v3 backend (and fence) for [fencelock](fencelock_core).
//!
//! - The grants of one backend instance with the same TTL share one etcd
//!   lease; acquire is one put-if-absent Txn (`create_revision == 0` → put
//!   with the shared lease, else get the holder), release one delete Txn
//!   (`create_revision == token`).
//! - The fencing token is the key's **create revision**: cluster-wide
//!   monotonic, never reused, unaffected by deletion, restarts or failover.
//!   It cannot be raised to a floor, so `min_token` is not offered.
//! - Renew is a `LeaseKeepAlive` on the shared lease followed by a Txn
//!   proving the key still carries the grant (its create revision and that
//!   lease); `renew_many` sends one keep-alive per distinct lease and one Txn
//!   reading every key of the batch. A renewal with another TTL moves the key
//!   to the shared lease of that TTL.
//! - Waiters watch the key for DELETE events; `watch` follows a key's
//!   holder changes, telling an expiry from a release by the deleted key's
//!   lease; `changes` follows the whole store with one watch of its lock
//!   keys' prefix.
//! - `layout=etcd` ([`EtcdLayoutBackend`]) lays locks out as etcd's own
//!   `concurrency` package does, so that `etcdctl lock`/`elect` and Go's
//!   `concurrency.Mutex`/`Election` exclude fencelock and are excluded by it.
//! - etcd rounds small TTLs up (about 2 s minimum with default settings); the
//!   granted TTL is returned in `Grant::ttl`.
//!
//! See `docs/etcd.md`.

mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod changes;
mod error;
mod fence;
mod layout;
mod options;
mod prefer;
mod queue;
mod watch;

use std::sync::Arc;

use async_trait::async_trait;

pub use backend::EtcdBackend;
pub use fence::EtcdFence;
pub use layout::EtcdLayoutBackend;
pub use options::{Balance, EtcdOptions, Layout, DEFAULT_PREFIX};

/// Opens Etcd backends and fences from `etcd://host:port[,host:port…]` URLs.
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdDriver;

#[async_trait]
impl fencelock_core::Driver for EtcdDriver {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["etcd"]
    }

    async fn open_backend(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
        let options = EtcdOptions::from_url(url)?;
        Ok(match options.layout {
            Layout::Etcd => Arc::new(EtcdLayoutBackend::connect_with(options).await?),
            _ => Arc::new(EtcdBackend::connect_with(options).await?),
        })
    }

    async fn open_fence(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
        Ok(Arc::new(EtcdFence::connect(url).await?))
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
            |url| Box::pin(async move { super::EtcdDriver.open_backend(&url).await }),
            |url| Box::pin(async move { super::EtcdDriver.open_fence(&url).await }),
            &["etcd://user:s3cret@host", "redis://user:s3cret@h:1"],
            "s3cret",
        )
        .await
    }
}
