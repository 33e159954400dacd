//! The two clocks a guard reads.
//!
//! Timers and deadlines run on tokio's monotonic clock (which tests can
//! pause). On Linux that clock stops while the machine is suspended, but a
//! backend's clock does not: after a five-minute suspend a 30 s lease is long
//! gone while the monotonic deadline says it has 29 s left. So every grant
//! also records the boot-time clock (`CLOCK_BOOTTIME`, which counts suspend),
//! and a lease is trusted only while *both* clocks are inside its window.

use std::time::Duration;

use tokio::time::Instant;

/// The instant a request was sent, on both clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    pub(crate) mono: Instant,
    pub(crate) boot: Option<Duration>,
}

impl Sent {
    pub(crate) fn now() -> Self {
        Self {
            mono: Instant::now(),
            boot: boot_time(),
        }
    }
}

/// Time since boot including suspend, where the OS offers it.
pub(crate) fn boot_time() -> Option<Duration> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use nix::time::{clock_gettime, ClockId};
        let t = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?;
        Some(Duration::new(
            u64::try_from(t.tv_sec()).ok()?,
            u32::try_from(t.tv_nsec()).ok()?,
        ))
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        // macOS's monotonic clock already counts sleep; elsewhere the
        // monotonic deadline is all there is.
        None
    }
}
