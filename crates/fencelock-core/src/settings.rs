//! [`AcquireSettings`]: the settings every kind of acquisition takes, as
//! one trait, for code that sets them the same way whatever it acquires.

use std::time::Duration;

use serde_json::Value;

use crate::{client::LockRequest, multi::MultiLockRequest, semaphore::SemaphoreRequest};

/// The settings a lock, a semaphore permit and an all-or-nothing
/// acquisition of several keys all take: lease length, wait, label, data
/// and renewal period.
///
/// Each request has the same methods of its own; this trait lets code that
/// receives these settings from elsewhere (a language binding's options
/// object, a configuration file) apply them in one place to any request.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use fencelock_core::{AcquireSettings, LockClient, MemoryBackend};
///
/// /// The settings of a job's configuration, applied to any acquisition.
/// fn configured<R: AcquireSettings>(request: R) -> R {
///     request
///         .ttl(Duration::from_secs(30))
///         .wait(Duration::from_secs(5))
///         .kind("nightly")
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock_core::Result<()> {
/// let client = LockClient::builder(Arc::new(MemoryBackend::new())).build()?;
/// let lock = configured(client.lock("report")).acquire().await?;
/// let permit = configured(client.semaphore("exports", 2)).acquire().await?;
/// let all = configured(client.lock_all(["a", "b"])).acquire().await?;
/// assert_eq!(client.inspect("report").await?.and_then(|l| l.kind).as_deref(), Some("nightly"));
/// # drop((lock, permit, all));
/// # Ok(())
/// # }
/// ```
pub trait AcquireSettings: Sized {
    /// Lease length; renewal extends it by this much each time.
    fn ttl(self, ttl: Duration) -> Self;
    /// How long the acquisition may wait (default: not at all).
    fn wait(self, wait: Duration) -> Self;
    /// A label stored with the lease.
    fn kind(self, kind: impl Into<String>) -> Self;
    /// JSON metadata stored with the lease.
    fn data(self, data: Value) -> Self;
    /// Renewal period (default: a third of the TTL).
    fn renew_every(self, period: Duration) -> Self;
}

/// Each request's own methods, behind the trait.
macro_rules! acquire_settings {
    ($($request:ident),*) => {$(
        impl AcquireSettings for $request<'_> {
            fn ttl(self, ttl: Duration) -> Self {
                $request::ttl(self, ttl)
            }
            fn wait(self, wait: Duration) -> Self {
                $request::wait(self, wait)
            }
            fn kind(self, kind: impl Into<String>) -> Self {
                $request::kind(self, kind)
            }
            fn data(self, data: Value) -> Self {
                $request::data(self, data)
            }
            fn renew_every(self, period: Duration) -> Self {
                $request::renew_every(self, period)
            }
        }
    )*};
}

acquire_settings!(LockRequest, SemaphoreRequest, MultiLockRequest);
