//! The core of fencelock: a distributed lock whose every grant carries a
//! **fencing token**.
//!
//! This crate holds what every backend shares:
//!
//! - [`Backend`]: the small object-safe trait of atomic operations a storage
//!   engine implements (one crate per engine: SQLite, PostgreSQL, …);
//! - [`LockClient`] and [`LockGuard`]: acquisition with waiting, background
//!   renewal, and a loud signal when a lock is lost;
//! - [`Fence`]: the check a protected resource runs to refuse stale holders;
//! - [`Error`]: one error type, with [`Error::is_transient`];
//! - [`MemoryBackend`] and [`MemoryFence`]: in-process implementations for tests
//!   and single-process programs.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use fencelock_core::{LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), fencelock_core::Error> {
//! let client = LockClient::new(Arc::new(MemoryBackend::new()));
//! let guard = client.lock("order:123").ttl(Duration::from_secs(10)).acquire().await?;
//! guard.check()?; // call before each critical write
//! println!("holding {} with token {}", guard.key(), guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod backoff;
#[doc(hidden)]
pub mod baseline;
mod client;
mod clock;
mod error;
mod fence;
mod guard;
mod memory;
pub mod metrics;
mod types;
mod wake;

pub use backend::{Acquire, AcquireRequest, Backend, Capabilities, Grant, Stats};
pub use backoff::Backoff;
pub use client::{ClockPolicy, LockClient, LockClientBuilder, LockRequest};
pub use error::{BackendError, Error, LossReason, Result};
pub use fence::{Admission, Fence};
pub use guard::{GuardHandle, LockGuard};
pub use memory::{MemoryBackend, MemoryFence};
pub use types::{
    parse_duration, redact_url, validate_ttl, FencingToken, LockInfo, LockKey, Owner, MAX_NAME_LEN,
    MAX_TTL,
};
pub use wake::{WakeHub, WakeSubscription};

/// Re-exported so backends and users name the same versions.
pub use async_trait::async_trait;
/// Re-exported: the cancellation token type handed out by guards.
pub use tokio_util::sync::CancellationToken;
