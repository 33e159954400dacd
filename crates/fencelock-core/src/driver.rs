//! Drivers: how a URL becomes a backend or a fence.
//!
//! Each backend crate exports one [`Driver`]; the `fencelock` facade keeps
//! the list of drivers compiled in and picks one by the URL's scheme, so
//! adding an engine adds one entry, not a branch in every function.

use std::{fmt, sync::Arc};

use async_trait::async_trait;

use crate::{
    backend::Backend,
    error::Result,
    fence::Fence,
    memory::{MemoryBackend, MemoryFence},
};

/// Opens the backend and the fence of one engine from a URL.
#[async_trait]
pub trait Driver: Send + Sync + fmt::Debug {
    /// The engine's name, as its backend reports it (`postgres`, …).
    fn name(&self) -> &'static str;

    /// The lower-case URL schemes this driver opens, e.g.
    /// `["postgres", "postgresql"]`.
    fn schemes(&self) -> &'static [&'static str];

    /// Connects to (or opens) the backend `url` names.
    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>>;

    /// Connects to (or opens) the fence kept where `url` says.
    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>>;

    /// The engine's own limit for `fencelock bench --baseline`: raw lock
    /// cycles configured as the backend for `url`. The default cycles
    /// through the backend itself, without the client (right for the
    /// in-process memory backend); server engines override it with their
    /// raw statements, scripts or RPCs. Not a stable API.
    #[doc(hidden)]
    #[cfg(feature = "baseline")]
    async fn open_baseline(&self, url: &str) -> Result<Box<dyn crate::baseline::RawBaseline>> {
        let backend = self.open_backend(url).await?;
        Ok(Box::new(crate::baseline::DirectBaseline::new(backend)?))
    }
}

/// `mem://`: a new, empty in-process backend or fence per URL opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryDriver;

#[async_trait]
impl Driver for MemoryDriver {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["mem", "memory"]
    }

    async fn open_backend(&self, _url: &str) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(MemoryBackend::new()))
    }

    async fn open_fence(&self, _url: &str) -> Result<Arc<dyn Fence>> {
        Ok(Arc::new(MemoryFence::new()))
    }
}
