//! A fencelock backend over named shards, each any other backend
//! (`docs/sharding.md`): a key lives on the shard its placement rule names
//! (`[[place]]`: the longest matching prefix, or the key itself), else on
//! the one rendezvous hashing of the shards' names chooses; a map in transition takes a moving key on both its
//! previous and its current owner, so that resharding keeps exclusion (I1)
//! and token order (I2). Each shard store records the highest map epoch
//! that has used it, and a process whose map is more than one step from it
//! is refused (`Error::InvalidArgument`), so only adjacent steps run
//! together.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use fencelock_sharded::{Shard, ShardMap, ShardedBackend};
//! let map = ShardMap::new(1, vec![Shard::new("a", "mem://"), Shard::new("b", "mem://")])?;
//! let backend = ShardedBackend::open(map, |url| {
//!     Box::pin(async move { fencelock_core::MemoryDriver.open_backend(&url).await })
//! })
//! .await?;
//! # use fencelock_core::Driver;
//! let client = fencelock_core::LockClient::new(std::sync::Arc::new(backend));
//! let guard = client.lock("order:1").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! The crate does not open backends itself: it is given an [`Opener`] (the
//! `fencelock` crate passes its own URL dispatch), so it depends on no
//! backend crate and the facade can register it without a dependency cycle.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod config;
mod epoch;
mod hash;

use std::{future::Future, path::Path, pin::Pin, sync::Arc};

use async_trait::async_trait;
use fencelock_core::{Backend, Driver, Error, Fence, Result};

pub use backend::ShardedBackend;
pub use config::{KeyMatch, MapError, Phase, Placement, Shard, ShardMap};

/// The URL scheme: `sharded:///path/to/shards.toml`.
pub const SCHEME: &str = "sharded";

/// What an [`Opener`] returns.
pub type OpenFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn Backend>>> + Send>>;

/// Opens the backend a shard's URL names (never a `sharded://` one: the
/// map refuses those before).
pub type Opener = fn(String) -> OpenFuture;

/// The [`Driver`] of `sharded://` URLs, opening shards with its
/// [`Opener`].
#[derive(Clone, Copy)]
pub struct ShardedDriver {
    open: Opener,
}

impl std::fmt::Debug for ShardedDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedDriver").finish_non_exhaustive()
    }
}

impl ShardedDriver {
    /// A driver that opens each shard with `open` (usable in a `static`).
    pub const fn new(open: Opener) -> Self {
        Self { open }
    }
}

/// The map file a `sharded://` URL names.
fn map_path(url: &str) -> Result<&Path> {
    let path = url
        .split_once("://")
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(SCHEME))
        .map(|(_, path)| path)
        .filter(|path| path.starts_with('/'))
        .ok_or_else(|| {
            Error::InvalidUrl(format!(
                "{url:?} is not a sharded URL; expected sharded:///path/to/shards.toml"
            ))
        })?;
    Ok(Path::new(path))
}

#[async_trait]
impl Driver for ShardedDriver {
    fn name(&self) -> &'static str {
        "sharded"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &[SCHEME]
    }

    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>> {
        let map = ShardMap::read(map_path(url)?)?;
        Ok(Arc::new(ShardedBackend::open(map, self.open).await?))
    }

    /// A fence protects a resource, not a key range, so it belongs to the
    /// resource's own store: open that backend's fence by its URL.
    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>> {
        map_path(url)?;
        Err(Error::Unsupported(
            "a sharded map has no fence of its own; open the fence of the store next to the \
             protected resource by its URL"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(map_path("sharded:///etc/fencelock/shards.toml").is_ok());
        assert!(map_path("SHARDED:///x.toml").is_ok());
        assert!(matches!(
            map_path("sharded://relative.toml"),
            Err(Error::InvalidUrl(_))
        ));
        assert!(matches!(map_path("redis://h"), Err(Error::InvalidUrl(_))));
    }
}
