//! The core of fencelock: a distributed lock whose every grant carries a
//! **fencing token**.
//!
//! Applications usually depend on the `fencelock` crate, which re-exports
//! this one and opens backends by URL. This crate holds what every backend
//! shares.
//!
//! # For applications
//!
//! - [`LockClient`] (built with [`LockClient::builder`]) and [`LockRequest`]:
//!   acquisition with a TTL, waiting, `run`/`with_lock` helpers;
//! - [`LockClient::semaphore`] ([`Permit`]) and [`LockClient::lock_all`]
//!   ([`MultiGuard`]): counting semaphores and all-or-nothing multi-key
//!   locks, both made of ordinary leases; [`AcquireSettings`] sets the
//!   settings all three requests share in one place;
//! - [`LockGuard`] and [`GuardHandle`]: a held lock, renewed in the
//!   background, with [`check`](GuardHandle::check),
//!   [`lost`](GuardHandle::lost) and the grant's [`FencingToken`];
//! - [`Fence`] and [`Admission`]: the check a protected resource runs to
//!   refuse stale holders;
//! - [`Error`] (with [`Error::is_transient`]), [`BackendError`],
//!   [`LossReason`], [`Result`];
//! - [`LockKey`], [`Owner`], [`LockInfo`], [`ClockPolicy`], and the
//!   [`metrics`] names;
//! - [`Election`], [`Leadership`], [`Leader`], [`LeaderWatch`]: leader
//!   election on the lock, with the term as fencing token
//!   (`docs/election.md`); [`LockClient::validate`] and
//!   [`LockClient::resume`] (`docs/reentry.md`);
//! - [`MemoryBackend`] and [`MemoryFence`]: in-process implementations for
//!   tests and single-process programs.
//!
//! The invariants every backend keeps (exclusion, growing tokens, ownership,
//! backend time, the conservative client view, expiry, fencing) are
//! described in `docs/semantics.md` as I1–I7.
//!
//! # For backend authors
//!
//! A storage engine implements [`Backend`], a small object-safe trait of
//! atomic operations taking an [`AcquireRequest`] and answering
//! [`Acquire`] / [`Grant`], declares its [`Capabilities`], and reports
//! [`Stats`]. [`WakeHub`] and [`WakeSubscription`] deliver release
//! notifications to waiters in the same process, and [`Backoff`] paces
//! waiters without them. [`async_trait`](macro@async_trait) is re-exported so that
//! implementations name the same version. The conformance suite in
//! `fencelock-testkit` checks an implementation against I1–I7.
//!
//! # Example
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
//!
//! # For tests
//!
//! With the `test-util` feature, the `fault` module wraps a backend so that
//! its calls fail, hang or answer late, switched at run time.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod backoff;
#[cfg(feature = "baseline")]
#[doc(hidden)]
pub mod baseline;
mod changes;
mod client;
mod clock;
mod deadline;
mod driver;
mod election;
mod error;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod fault;
mod fence;
mod guard;
mod lease;
mod memory;
pub mod metrics;
mod multi;
mod page;
mod poll;
mod renewer;
mod semaphore;
mod settings;
mod types;
mod wake;
mod watch;

pub use backend::{
    part_bound, renew_alone, renew_each_mode, renew_one_by_one, renew_part, renew_writers_batched,
    Acquire, AcquireAll, AcquireRequest, Backend, BackendAdmin, Capabilities, FairQueue, Grant,
    Renewal, Stats, WriteIntents,
};
pub use backoff::Backoff;
pub use changes::{Change, ChangeFeed, ChangeHub, WatchedHub};
pub use client::{
    validate_data, LockClient, LockClientBuilder, LockRequest, ResumeRequest, RwLock,
};
pub use clock::ClockPolicy;
pub use driver::{Driver, MemoryDriver};
pub use election::{Election, Leader, LeaderChange, LeaderWatch, Leadership, ELECTION_PREFIX};
pub use error::{
    shorten, shorten_to, BackendError, Error, ErrorStatus, LossReason, Result, SHORTEN_TO,
};
pub use fence::{validate_value, Admission, Fence, FenceRecord, FencedValue, MAX_FENCED_VALUE};
pub use guard::{wait_for_background_releases, GuardHandle, LockGuard};
pub use lease::LOSS_LOG_TARGET;
pub use memory::{MemoryBackend, MemoryFence};
pub use multi::{MultiGuard, MultiLockRequest};
pub use page::page_by_key;
pub use semaphore::{
    semaphore_slot_key, Permit, PermitHolder, SemaphoreRequest, MAX_PERMITS, SEMAPHORE_PREFIX,
};
pub use settings::AcquireSettings;
pub use types::{
    parse_duration, redact_url, validate_ttl, FencingToken, LeaseId, LockInfo, LockKey, LockMode,
    Owner, MAX_NAME_LEN, MAX_TTL,
};
pub use wake::{WakeHub, WakeSubscription};
pub use watch::{HolderChange, Watch, WatchFeeder};

/// Re-exported so backends and users name the same versions.
pub use async_trait::async_trait;
/// Re-exported: the cancellation token type handed out by guards.
pub use tokio_util::sync::CancellationToken;
