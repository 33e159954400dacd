//! etcd v3 backend (and fence) for [fencelock](fencelock_core).
//!
//! - One etcd lease per grant, granted right before a put-if-absent Txn
//!   (`create_revision == 0` → put with the lease, else get the holder).
//! - The fencing token is the key's **create revision**: cluster-wide
//!   monotonic, never reused, unaffected by deletion, restarts or failover.
//! - Renew is one `LeaseKeepAlive` round trip on the grant's own lease;
//!   release and force-release revoke that lease, which deletes the key.
//! - Waiters watch the key for DELETE events.
//! - etcd rounds small TTLs up (about 2 s minimum with default settings); the
//!   granted TTL is returned in `Grant::ttl`.
//!
//! See `docs/etcd.md`.

mod backend;
mod error;
mod fence;
mod options;

use std::sync::Arc;

pub use backend::EtcdBackend;
pub use fence::EtcdFence;
pub use options::{EtcdOptions, DEFAULT_PREFIX};

/// Opens an etcd backend from an `etcd://host:port[,host:port…]` URL.
pub async fn open_backend(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
    Ok(Arc::new(EtcdBackend::open(url).await?))
}

/// Opens an etcd fence from the same kind of URL.
pub async fn open_fence(url: &str) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
    Ok(Arc::new(EtcdFence::open(url).await?))
}

#[cfg(test)]
mod tests {
    use fencelock_core::Error;

    #[tokio::test]
    async fn entry_points_refuse_malformed_urls_without_echoing_the_password() {
        for bad in ["etcd://user:s3cret@host", "redis://user:s3cret@h:1"] {
            match super::open_backend(bad).await {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
            match super::open_fence(bad).await {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
