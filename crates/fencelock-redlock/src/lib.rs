//! Redlock backend for [fencelock](fencelock_core): leases held by a
//! majority of N (odd, ≥ 3) independent Redis servers, with fencing tokens
//! that keep growing (I2) across node crashes and restarts without
//! persistence.
//!
//! - Acquire is, without contention, one round to every node at once: a
//!   grant of a token the client proposes (above a lower bound of the
//!   nodes' clocks in µs, which tokens follow), which each node accepts
//!   only if the key is free, the token is above its counter and the node
//!   is not in quarantine. Granted as soon as a majority accepted within
//!   the lease's validity (TTL − elapsed − drift), and
//!   [`Grant::ttl`](fencelock_core::Grant::ttl) is that validity. A token
//!   refused as too low comes back with the node's highest, for the next
//!   round; racers that split the vote yield to the one holding the first
//!   node that voted (the arbiter).
//! - Late grants (from nodes that answered after the decision) are undone
//!   in the background; a node that failed a request is skipped for a
//!   while, then tried again without being waited for.
//! - Every accepting node stores the token, so every later majority
//!   contains a node that has seen it: tokens never go backwards.
//! - A node that lost its data (no marker key) takes no part until a client
//!   re-forms it: floored above the tokens of a majority and quarantined
//!   for `max_ttl`, so that it never helps a second holder to a majority.
//! - Renew and release run the Redis backend's own scripts on every node
//!   (owner and token checked); renew succeeds as soon as a majority
//!   extended in time, release answers once a majority answered.
//!
//! See `docs/redlock.md` for the argument, what is and is not guaranteed,
//! and what happens when a majority of nodes restarts at once.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! let backend = std::sync::Arc::new(
//!     fencelock_redlock::RedlockBackend::connect(
//!         "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?prefix=myapp",
//!     )
//!     .await?,
//! );
//! let client = fencelock_core::LockClient::new(backend);
//! let guard = client.lock("job:1").acquire().await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod acquire;
mod backend;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod fanout;
mod options;
#[doc(hidden)]
pub mod protocol;
mod scripts;

use std::sync::Arc;

use async_trait::async_trait;

pub use backend::RedlockBackend;
pub use options::{RedlockOptions, DEFAULT_MAX_TTL, DEFAULT_NODE_TIMEOUT};

/// Opens Redlock backends from `redlock://` URLs. It has no fence of its
/// own: fence the resource with a fence of the resource's store.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedlockDriver;

#[async_trait]
impl fencelock_core::Driver for RedlockDriver {
    fn name(&self) -> &'static str {
        backend::NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["redlock"]
    }

    async fn open_backend(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Backend>> {
        Ok(Arc::new(RedlockBackend::connect(url).await?))
    }

    async fn open_fence(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Arc<dyn fencelock_core::Fence>> {
        // Refuse a malformed URL as such before saying there is no fence.
        RedlockOptions::from_url(url)?;
        Err(fencelock_core::Error::unsupported(
            backend::NAME,
            "fences (fence the resource in its own store: sqlite://, postgres://, redis://…)",
        ))
    }

    #[cfg(feature = "baseline")]
    async fn open_baseline(
        &self,
        url: &str,
    ) -> fencelock_core::Result<Box<dyn fencelock_core::baseline::RawBaseline>> {
        baseline::open(url).await
    }
}
