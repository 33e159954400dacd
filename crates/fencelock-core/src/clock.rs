//! The two clocks a guard reads, and how far it trusts them ([`ClockPolicy`]).
//!
//! Timers and deadlines run on tokio's monotonic clock (which tests can
//! pause). On Linux that clock stops while the machine is suspended, but a
//! backend's clock does not: after a five-minute suspend a 30 s lease is long
//! gone while the monotonic deadline says it has 29 s left. So every grant
//! also records the boot-time clock (`CLOCK_BOOTTIME`, which counts suspend),
//! and a lease is trusted only while *both* clocks are inside its window.

use std::{sync::OnceLock, time::Duration};

use tokio::{sync::Notify, time::Instant};

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

/// How often the suspend detector compares the two clocks.
const SUSPEND_CHECK: Duration = Duration::from_secs(1);
/// How far the boot-time clock must run ahead of the monotonic clock between
/// two checks to count as a suspend (both clocks otherwise tick together).
const SUSPEND_JUMP: Duration = Duration::from_millis(100);

/// Notifies every waiter soon after the machine resumed from a suspend, so
/// that guards can compare their leases with the boot-time clock at once
/// rather than at their next timer. One thread per process, started with the
/// first guard, looks once a second: each guard doing so itself cost a
/// timer, a wake-up per second and a boxed `Sleep` per held lock.
pub(crate) fn suspends() -> &'static Notify {
    static NOTIFY: OnceLock<&'static Notify> = OnceLock::new();
    NOTIFY.get_or_init(|| {
        let notify: &'static Notify = Box::leak(Box::default());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            // The baseline is read before the thread runs: a suspend between
            // the first guard and the thread's start would otherwise become
            // the baseline and go unnoticed.
            let baseline = suspended_so_far();
            let started = std::thread::Builder::new()
                .name("fencelock-suspend".into())
                .spawn(move || watch_for_suspends(notify, baseline));
            if let Err(e) = started {
                // Guards still see a suspend at their next renewal or
                // deadline, and `is_valid` checks the boot clock every time.
                tracing::warn!(error = %e, "cannot start the suspend detector");
            }
        }
        notify
    })
}

/// Boot-time minus monotonic time: grows by the length of every suspend.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn suspended_so_far() -> Option<Duration> {
    use nix::time::{clock_gettime, ClockId};
    let mono = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    let mono = Duration::new(
        u64::try_from(mono.tv_sec()).ok()?,
        u32::try_from(mono.tv_nsec()).ok()?,
    );
    boot_time()?.checked_sub(mono)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn watch_for_suspends(notify: &Notify, mut last: Option<Duration>) {
    loop {
        std::thread::sleep(SUSPEND_CHECK);
        let now = suspended_so_far();
        if let (Some(now), Some(before)) = (now, last) {
            if now > before + SUSPEND_JUMP {
                notify.notify_waiters();
            }
        }
        last = now;
    }
}

/// How conservatively a guard believes in its lease (invariant I5).
///
/// After a grant or renewal sent at monotonic instant `t_sent`, the guard
/// considers itself valid until
/// `t_sent + ttl × (1 − drift) − min(ttl / 10, max_margin)`.
/// Because `t_sent` is taken *before* the request leaves, and the backend
/// starts its lease only when the request arrives, the guard's belief ends
/// before the backend's lease does, even if the two clocks run at rates that
/// differ by up to `drift`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockPolicy {
    /// Largest relative rate difference between the client's and the
    /// backend's clocks (default 1%).
    pub drift: f64,
    /// Upper bound of the safety margin subtracted from every lease (default
    /// 500 ms); the margin is a tenth of the TTL below that. It covers timer
    /// latency between the deadline and the moment the application reacts.
    pub max_margin: Duration,
}

impl Default for ClockPolicy {
    fn default() -> Self {
        Self {
            drift: 0.01,
            max_margin: Duration::from_millis(500),
        }
    }
}

impl ClockPolicy {
    /// How long after `t_sent` a lease of `ttl` is trusted locally.
    pub fn valid_for(&self, ttl: Duration) -> Duration {
        let drift = if self.drift.is_finite() {
            self.drift.clamp(0.0, 0.5)
        } else {
            0.5
        };
        let margin = (ttl / 10).min(self.max_margin);
        ttl.mul_f64(1.0 - drift).saturating_sub(margin)
    }
}
