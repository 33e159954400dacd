//! The named bounds the tests and `examples/check.rs` use, one place.

use crate::{
    common::{run, Outcome, Timing},
    election::{self, Election},
    redlock::{self, Redlock},
    redlock_fast::{self, RedlockFast},
    sharding::{self, Resharding},
};

/// Every model name [`check`] knows: the models, then their broken twins.
pub const MODELS: [&str; 14] = [
    "redlock",
    "redlock-timed",
    "redlock-fast",
    "redlock-fast-timed",
    "sharding",
    "election",
    "redlock-broken",
    "redlock-timed-broken",
    "redlock-fast-broken",
    "redlock-fast-timed-broken",
    "redlock-fast-unchecked-broken",
    "redlock-fast-fresh-join-broken",
    "sharding-broken",
    "election-broken",
];

/// Checks `model` (one of [`MODELS`]; `-broken` for a twin) at the small
/// bound or the deep one; `None` for an unknown name.
pub fn check(model: &str, deep: bool, threads: usize) -> Option<Outcome> {
    let (name, broken) = match model.strip_suffix("-broken") {
        Some(name) => (name, true),
        None => (model, false),
    };
    Some(match name {
        "redlock" => {
            let mut c = redlock::Config::small();
            if deep {
                // A restart while leases end with time.
                ticking(&mut c.timing);
                c.horizon = 1;
            }
            c.quarantine = !broken;
            run(Redlock(c), threads, broken)
        }
        "redlock-timed" => {
            let mut c = redlock::Config::small();
            c.restarts = 0;
            ticking(&mut c.timing);
            c.horizon = if deep { 2 } else { 1 };
            c.timing.conservative = !broken;
            run(Redlock(c), threads, broken)
        }
        "redlock-fast-timed" => {
            let mut c = redlock_fast::Config::small();
            c.restarts = 0;
            c.rounds = 2;
            ticking(&mut c.timing);
            c.horizon = if deep { 2 } else { 1 };
            c.timing.conservative = !broken;
            run(RedlockFast(c), threads, broken)
        }
        // The twins: quarantine removed; the grant's token check removed
        // (no `Stale`); the join of a formed majority that never granted
        // anything without quarantine (the rule this model refuted).
        "redlock-fast" | "redlock-fast-unchecked" | "redlock-fast-fresh-join" => {
            let mut c = redlock_fast::Config::small();
            if deep {
                // A restart while leases end with time.
                ticking(&mut c.timing);
                c.horizon = 1;
            }
            match name {
                "redlock-fast" if broken => {
                    // A client that probes, so that a node rejoins.
                    c.quarantine = false;
                    c.knowing = 1;
                    c.probes = 2;
                }
                "redlock-fast" => {}
                "redlock-fast-unchecked" if broken => {
                    // Two clients that guess from their clock readings and
                    // release: only the nodes' check keeps the second
                    // one's token above the first's.
                    c.token_check = false;
                    c.rounds = 2;
                    c.releases = true;
                    c.restarts = 0;
                }
                "redlock-fast-fresh-join" if broken => {
                    // The rule forms nodes as a new set: the client probes
                    // again to use them.
                    c.unproven_fresh_join = true;
                    c.knowing = 1;
                    c.probes = 2;
                }
                _ => return None,
            }
            run(RedlockFast(c), threads, broken)
        }
        "election" => {
            let mut c = election::Config::small();
            if deep {
                // 3 requests with a crash did not finish in the time the
                // deep runs had (`docs/safety.md`).
                c.crashes = 1;
            }
            c.timing.conservative = !broken;
            run(Election(c), threads, broken)
        }
        "sharding" => {
            let mut c = sharding::Config::small();
            if deep {
                c.horizon = 4;
            }
            if broken {
                // `handover` skipped: clients on `join` and the new map.
                c.steps = vec![1, 2, 4];
            }
            run(Resharding(c), threads, broken)
        }
        _ => return None,
    })
}

/// The TTL of the bounds with ticks, 2: the shortest in which a lease
/// ends before its TTL on a fast clock (one granted at tick 0 at tick 1,
/// where the trust window of its request ends) and a quarantine begun at
/// tick 0 ends (at tick 2).
fn ticking(timing: &mut Timing) {
    timing.ttl = 2;
}
