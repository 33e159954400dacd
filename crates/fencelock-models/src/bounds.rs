//! The named bounds the tests and `examples/check.rs` use, one place.

use crate::{
    common::{run, Outcome},
    election::{self, Election},
    redlock::{self, Redlock},
    redlock_fast::{self, RedlockFast},
    sharding::{self, Resharding},
};

/// Every model name [`check`] knows: the models, then their broken twins.
pub const MODELS: [&str; 10] = [
    "redlock",
    "redlock-fast",
    "sharding",
    "election",
    "redlock-broken",
    "redlock-fast-broken",
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
                c.horizon = 2;
                c.probe_losses = true;
            }
            c.quarantine = !broken;
            run(Redlock(c), threads, broken)
        }
        // The twins: quarantine removed; the grant's token check removed
        // (no `Stale`); the join of a formed majority that never granted
        // anything without quarantine (the rule this model refuted).
        "redlock-fast" | "redlock-fast-unchecked" | "redlock-fast-fresh-join" => {
            let mut c = redlock_fast::Config::small();
            if deep {
                // Time passing: leases end at tick 1 on fast nodes and a
                // quarantine begun at tick 0 ends at tick 2.
                c.timing.ttl = 2;
                c.horizon = 2;
                c.knowing = 1;
                c.rounds = 2;
                c.probes = 2;
                c.releases = true;
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
                c.requests = 3;
                c.crashes = 1;
                c.horizon = 6;
            }
            c.timing.conservative = !broken;
            run(Election(c), threads, broken)
        }
        "sharding" => {
            let mut c = sharding::Config::small();
            if deep {
                c.attempts = 2;
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
