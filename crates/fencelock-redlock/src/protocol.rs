//! The protocol's numbers: how many rounds and probes an acquisition runs,
//! the drift allowance, the validity window and a rejoining node's
//! quarantine. The models (`crates/fencelock-models`) read them from here,
//! and a test there fails when a bound explores what this code does not
//! do or when a formula stops being the one the models assume
//! (`docs/safety.md`, "The models and the code").

use std::time::Duration;

/// The most grant rounds of one attempt.
pub const ROUNDS: usize = 8;

/// How many probe rounds the slow path (docs/redlock.md, "Acquire") runs
/// while forming nodes before it gives up.
pub const PROBES: usize = 5;

/// The allowance for clock-rate drift between the nodes and a client over
/// a lease of `ttl`: 1 % of it plus 2 ms, as in antirez's description.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// What is left of a lease of `ttl` whose request went out `elapsed` ago,
/// allowing for [`drift`].
pub fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl))
        .filter(|v| !v.is_zero())
}

/// How long a node that lost its data and rejoins waits before it votes:
/// `max_ttl` on its clock plus the drift, so that every lease it granted
/// before has ended on every clock within the drift bound.
pub fn quarantine(max_ttl: Duration) -> Duration {
    max_ttl + drift(max_ttl)
}
