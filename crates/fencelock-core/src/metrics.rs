//! Metric names, recorded through the [`metrics`](https://docs.rs/metrics)
//! facade. Install any recorder (Prometheus, StatsD, …) to export them; with
//! none installed, recording costs next to nothing.
//!
//! Every metric carries a `backend` label (`memory`, `sqlite`, …). Keys are
//! deliberately *not* labels: lock keys such as `order:123` are unbounded and
//! would explode a metrics store. `docs/observability.md` lists the same names.

/// Counter: acquisition attempts (each `try_acquire` round trip).
pub const ACQUIRE_ATTEMPTS: &str = "fencelock_acquire_attempts_total";
/// Counter: successful acquisitions.
pub const ACQUIRE_SUCCESSES: &str = "fencelock_acquire_successes_total";
/// Counter: acquisitions that gave up at their wait deadline.
pub const ACQUIRE_TIMEOUTS: &str = "fencelock_acquire_timeouts_total";
/// Histogram (seconds): time from the start of an acquisition to the grant.
pub const WAIT_SECONDS: &str = "fencelock_wait_seconds";
/// Histogram (seconds): time from grant to release or loss.
pub const HOLD_SECONDS: &str = "fencelock_hold_seconds";
/// Counter: renewals confirmed by the backend.
pub const RENEWALS: &str = "fencelock_renewals_total";
/// Histogram (seconds): round-trip time of each renewal attempt the watchdog
/// makes, whether it succeeds or fails (a timed-out attempt records its bound).
pub const RENEW_SECONDS: &str = "fencelock_renew_seconds";
/// Counter: renewal attempts that failed (transient errors and refusals).
pub const RENEWAL_FAILURES: &str = "fencelock_renewal_failures_total";
/// Counter: locks lost while held; label `reason` = `refused` | `deadline`.
pub const LOCKS_LOST: &str = "fencelock_locks_lost_total";
/// Counter: tokens a fence refused as stale; label `fence` = the fence's backend.
pub const FENCE_REJECTIONS: &str = "fencelock_fence_rejections_total";
/// Gauge: guards currently held by this process.
pub const HELD: &str = "fencelock_held";
