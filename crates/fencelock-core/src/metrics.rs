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
/// Histogram (seconds): round-trip time of each renewal attempt the renewer
/// makes, one sample per lease of a batch, whether it succeeds or fails (a
/// timed-out attempt records its bound).
pub const RENEW_SECONDS: &str = "fencelock_renew_seconds";
/// Counter: renewal attempts that failed (transient errors and refusals).
pub const RENEWAL_FAILURES: &str = "fencelock_renewal_failures_total";
/// Counter: locks lost while held; label `reason` = `refused` | `deadline`
/// | `closed`.
pub const LOCKS_LOST: &str = "fencelock_locks_lost_total";
/// Counter: tokens a fence refused as stale; label `fence` = the fence's backend.
pub const FENCE_REJECTIONS: &str = "fencelock_fence_rejections_total";
/// Gauge: guards currently held by this process.
pub const HELD: &str = "fencelock_held";
/// Histogram (seconds): how long each request to one node of a
/// `redlock://` set took, answered or not; label `node` = the node's
/// position in the URL (`0`, `1`, …). Set beside the bound a lease's
/// request has (a third of its TTL), it shows how far a node is from
/// being skipped.
pub const REDLOCK_NODE_SECONDS: &str = "fencelock_redlock_node_seconds";
/// Counter: times a `redlock://` node was skipped for not answering a
/// request within its bound (down, cut off, or farther away than a third
/// of the TTL); label `node`.
pub const REDLOCK_NODE_SKIPS: &str = "fencelock_redlock_node_skips_total";

/// Registers the help text and unit of every metric above with the recorder
/// installed now, so that exporters such as Prometheus print `# HELP` lines.
///
/// Building the process's first [`LockClient`](crate::LockClient) calls it;
/// call it yourself if you install a recorder after that, or if you only use
/// fences.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ACQUIRE_ATTEMPTS,
        Unit::Count,
        "Acquisition attempts: each round trip that tries to take a lock."
    );
    describe_counter!(ACQUIRE_SUCCESSES, Unit::Count, "Successful acquisitions.");
    describe_counter!(
        ACQUIRE_TIMEOUTS,
        Unit::Count,
        "Acquisitions that gave up at their wait deadline."
    );
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time from the start of an acquisition to the grant."
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from grant to release or loss."
    );
    describe_counter!(RENEWALS, Unit::Count, "Renewals confirmed by the backend.");
    describe_histogram!(
        RENEW_SECONDS,
        Unit::Seconds,
        "Round-trip time of each renewal attempt, successful or not."
    );
    describe_counter!(
        RENEWAL_FAILURES,
        Unit::Count,
        "Renewal attempts that failed (transient errors and refusals)."
    );
    describe_counter!(
        LOCKS_LOST,
        Unit::Count,
        "Locks lost while held, by reason (refused or deadline)."
    );
    describe_counter!(
        FENCE_REJECTIONS,
        Unit::Count,
        "Tokens a fence refused as stale."
    );
    describe_gauge!(HELD, Unit::Count, "Guards currently held by this process.");
    describe_histogram!(
        REDLOCK_NODE_SECONDS,
        Unit::Seconds,
        "Time of each request to one redlock node, answered or not."
    );
    describe_counter!(
        REDLOCK_NODE_SKIPS,
        Unit::Count,
        "Times a redlock node was skipped for not answering within its request's bound."
    );
}

/// [`describe`], once per process.
pub(crate) fn describe_once() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(describe);
}
