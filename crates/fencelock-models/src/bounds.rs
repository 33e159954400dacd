//! The named bounds the tests and `examples/check.rs` use, and the planted
//! bugs each must catch, one place.

use crate::{
    common::{run, Outcome, Step, Timing},
    election::{self, Election},
    plant::Plant,
    redlock::{self, Redlock},
    redlock_fast::{self, Act, Msg, RedlockFast},
    sharding::{self, Resharding},
};

/// Every bound [`check`] knows, each a model with its settings. CI checks
/// each at its small size (`tests/it/models.rs`) and every planted bug of
/// [`MUTANTS`] on its bound (`tests/it/mutations.rs`).
pub const BOUNDS: [&str; 9] = [
    "redlock",
    "redlock-timed",
    "redlock-fast",
    "redlock-fast-probing",
    "redlock-fast-releasing",
    "redlock-fast-timed",
    "redlock-fast-rejoin",
    "sharding",
    "election",
];

/// A planted bug and what must catch it: a counterexample to the `always`
/// property `breaks` at the small size of `bound`.
#[derive(Clone, Copy, Debug)]
pub struct Mutant {
    /// The bug.
    pub plant: Plant,
    /// The bound (one of [`BOUNDS`]) that catches it.
    pub bound: &'static str,
    /// The property the counterexample breaks.
    pub breaks: &'static str,
}

const fn mutant(plant: Plant, bound: &'static str, breaks: &'static str) -> Mutant {
    Mutant {
        plant,
        bound,
        breaks,
    }
}

/// The mutation suite: every planted bug, each on a bound CI runs
/// (`docs/safety.md`, "Planted bugs", has the counterexamples' sizes).
pub const MUTANTS: [Mutant; 20] = [
    mutant(Plant::JoinWithoutQuarantine, "redlock", "exclusion"),
    mutant(Plant::GrantIgnoresLease, "redlock", "exclusion"),
    mutant(Plant::TrustWholeTtl, "redlock-timed", "exclusion"),
    mutant(Plant::QuorumOfOne, "redlock-fast", "exclusion"),
    mutant(
        Plant::GrantIgnoresQuarantine,
        "redlock-fast-probing",
        "exclusion",
    ),
    mutant(
        Plant::JoinWithoutQuarantine,
        "redlock-fast-probing",
        "exclusion",
    ),
    mutant(Plant::FreshJoin, "redlock-fast-probing", "exclusion"),
    mutant(
        Plant::NoTokenCheck,
        "redlock-fast-releasing",
        "tokens increase",
    ),
    mutant(
        Plant::TokenCheckOffByOne,
        "redlock-fast-releasing",
        "tokens increase",
    ),
    mutant(Plant::TrustWholeTtl, "redlock-fast-timed", "exclusion"),
    mutant(
        Plant::RejoinFloorZero,
        "redlock-fast-rejoin",
        "tokens increase",
    ),
    mutant(Plant::SkipHandover, "sharding", "tokens increase"),
    mutant(Plant::PublishEarly, "sharding", "tokens increase"),
    mutant(Plant::UnflooredSecondHalf, "sharding", "tokens increase"),
    mutant(Plant::NoWatermark, "sharding", "tokens increase"),
    mutant(Plant::StoreGrantsHeldKey, "sharding", "exclusion"),
    mutant(Plant::TrustWholeTtl, "election", "one leader"),
    mutant(Plant::StoreGrantsHeldKey, "election", "one leader"),
    mutant(Plant::StoreForgetsCounter, "election", "terms increase"),
    mutant(Plant::RenewalTrustedFromAnswer, "election", "one leader"),
];

/// Checks `bound` (one of [`BOUNDS`]) at its small size or its deep one,
/// with `plant` planted (the check then stops at its first
/// counterexample); `None` for an unknown name.
pub fn check(bound: &str, deep: bool, plant: Option<Plant>, threads: usize) -> Option<Outcome> {
    let stop = plant.is_some();
    Some(match bound {
        "redlock" => {
            let mut c = redlock::Config::small();
            if deep {
                // A restart while leases end with time.
                ticking(&mut c.timing);
                c.horizon = 1;
            }
            c.plant = plant;
            run(Redlock(c), threads, stop)
        }
        "redlock-timed" => {
            let mut c = redlock::Config::small();
            c.restarts = 0;
            ticking(&mut c.timing);
            c.horizon = if deep { 2 } else { 1 };
            c.plant = plant;
            run(Redlock(c), threads, stop)
        }
        "redlock-fast-timed" => {
            let mut c = redlock_fast::Config::small();
            c.restarts = 0;
            c.rounds = 2;
            ticking(&mut c.timing);
            c.horizon = if deep { 2 } else { 1 };
            c.plant = plant;
            run(RedlockFast(c), threads, stop)
        }
        "redlock-fast-rejoin" => run(RedlockFast(rejoin(deep, plant)), threads, stop),
        "redlock-fast" | "redlock-fast-probing" | "redlock-fast-releasing" => {
            let mut c = redlock_fast::Config::small();
            if deep {
                // A restart while leases end with time.
                ticking(&mut c.timing);
                c.horizon = 1;
            }
            match bound {
                "redlock-fast-probing" => {
                    // A client that probes first, so that a node that
                    // lost its data rejoins while the other's grant runs.
                    c.knowing = 1;
                    c.probes = 2;
                }
                "redlock-fast-releasing" => {
                    // Two clients that guess their tokens from the same
                    // clock reading and release: only the nodes' check
                    // keeps the second one's token above the first's.
                    c.rounds = 2;
                    c.releases = true;
                    c.restarts = 0;
                }
                _ => {}
            }
            c.plant = plant;
            run(RedlockFast(c), threads, stop)
        }
        "election" => {
            let mut c = election::Config::small();
            if deep {
                // 3 requests with a crash did not finish in the time the
                // deep runs had (`docs/safety.md`).
                c.crashes = 1;
            }
            c.plant = plant;
            run(Election(c), threads, stop)
        }
        "sharding" => {
            let mut c = sharding::Config::small();
            if deep {
                c.horizon = 4;
            }
            c.plant = plant;
            run(Resharding(c), threads, stop)
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

/// `redlock-fast-rejoin`: a node that lost a lease rejoins, and its
/// quarantine ends. Every path begins at tick 0 with client 0 granted
/// token 1 by nodes 0 and 1 (its request to node 2 still in flight), node
/// 1 restarting empty, and client 2, which probes first, rejoining it (its
/// own grants of token 2 in flight); then anything may happen up to tick
/// 2, when node 1 votes again: client 1, whose clock reading is from tick
/// 0 (`lagging_clocks`), may propose token 1 there. The full search from
/// tick 0 with a restart and ticks to 2 does not finish in 10 minutes of
/// CPU (`docs/safety.md`); the prefix leaves out only the interleavings
/// before the rejoin.
fn rejoin(deep: bool, plant: Option<Plant>) -> redlock_fast::Config {
    let mut c = redlock_fast::Config::small();
    c.clients = 3;
    c.knowing = 2;
    c.lagging_clocks = true;
    ticking(&mut c.timing);
    c.horizon = if deep { 3 } else { 2 };
    c.prefix = vec![
        |s| *s == Step::Act(Act::Start(0)),
        |s| matches!(s, Step::Deliver(Msg::Grant { c: 0, n: 0, .. })),
        |s| matches!(s, Step::Deliver(Msg::Grant { c: 0, n: 1, .. })),
        |s| *s == Step::Act(Act::Restart(1)),
        |s| *s == Step::Act(Act::Start(2)),
        |s| *s == Step::Act(Act::Probe(2, 0b111)),
        |s| matches!(s, Step::Deliver(Msg::Mark { n: 1, .. })),
    ];
    c.plant = plant;
    c
}
