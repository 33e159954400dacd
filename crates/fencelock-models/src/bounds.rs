//! The named bounds the tests and `examples/check.rs` use, and the planted
//! bugs each must catch, one place.

use crate::{
    common::{run, Outcome, Step, Timing},
    election::{self, Election},
    fence::{self, Fence},
    plant::Plant,
    redlock::{self, Redlock},
    redlock_fast::{self, Act, Msg, RedlockFast},
    sharding::{self, Resharding},
};

/// Every bound [`check`] knows, each a model with its settings. CI checks
/// each at its small size (`tests/it/models.rs`) and every planted bug of
/// [`MUTANTS`] on its bound (`tests/it/mutations.rs`).
pub const BOUNDS: [&str; 13] = [
    "redlock",
    "redlock-timed",
    "redlock-fast",
    "redlock-fast-probing",
    "redlock-fast-releasing",
    "redlock-fast-timed",
    "redlock-fast-mixed-clocks",
    "redlock-fast-clock-step",
    "redlock-fast-clock-step-back",
    "redlock-fast-rejoin",
    "sharding",
    "election",
    "fence",
];

/// Bounds outside an assumption of `docs/redlock.md`, each with the
/// property the correct model must break there (`tests/it/models.rs`):
/// a node clock stepping forward past the guard's margin, a restart that
/// keeps the marker but loses the last writes (AOF `everysec`), and the
/// race at a set's first formation.
pub const LIMITS: [(&str, &str); 3] = [
    ("redlock-fast-clock-step-past-margin", "exclusion"),
    ("redlock-fast-stale-restart", "exclusion"),
    ("redlock-fast-formation", "exclusion"),
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
pub const MUTANTS: [Mutant; 29] = [
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
    mutant(Plant::QuorumOfOne, "redlock-fast-mixed-clocks", "exclusion"),
    mutant(
        Plant::TrustWithoutMargin,
        "redlock-fast-clock-step",
        "exclusion",
    ),
    mutant(
        Plant::TrustOnNodeClock,
        "redlock-fast-clock-step-back",
        "exclusion",
    ),
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
    mutant(
        Plant::FenceComparesBackwards,
        "fence",
        "no stale write admitted",
    ),
    mutant(
        Plant::FenceRecordsBeforeCheck,
        "fence",
        "no stale write admitted",
    ),
    mutant(Plant::FenceForgetsFloor, "fence", "no stale write admitted"),
    mutant(
        Plant::StoreForgetsCounter,
        "fence",
        "admitted tokens were granted",
    ),
    mutant(Plant::WaiterGivesUp, "fence", "every acquisition granted"),
    mutant(
        Plant::StoreKeepsExpiredLease,
        "fence",
        "every acquisition granted",
    ),
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
        _ if bound.starts_with("redlock-fast") => {
            let mut c = redlock_fast(bound, deep)?;
            c.base.plant = plant;
            // A limit's counterexample is what its check is for.
            let stop = stop || LIMITS.iter().any(|(name, _)| *name == bound);
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
        "fence" => {
            let mut c = fence::Config::small();
            if deep {
                c.writes = 2;
                c.horizon = 3;
            }
            c.plant = plant;
            run(Fence(c), threads, stop)
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

/// The configuration of a `redlock-fast…` bound of [`BOUNDS`]; `None`
/// for another name.
pub fn redlock_fast(bound: &str, deep: bool) -> Option<redlock_fast::Config> {
    let mut c = redlock_fast::Config::small();
    let timed = |c: &mut redlock_fast::Config| {
        c.base.restarts = 0;
        c.rounds = 2;
        ticking(&mut c.base.timing);
        c.base.horizon = if deep { 2 } else { 1 };
    };
    match bound {
        "redlock-fast-timed" => {
            timed(&mut c);
            return Some(c);
        }
        "redlock-fast-mixed-clocks" => {
            // Every mix of fast and slow node clocks, not only the
            // fastest: a slow node keeps a copy, and its quarantine,
            // longer than the others. One round: eight times the states
            // of one rate already.
            timed(&mut c);
            c.rounds = 1;
            c.base.fast_clocks_only = false;
            return Some(c);
        }
        "redlock-fast-clock-step" | "redlock-fast-clock-step-past-margin" => {
            // A guard's margin of 1 tick beyond the drift (TTL 3, so
            // that a window remains): a node clock stepping forward by
            // the margin ends its copy no earlier than the window; by
            // more, a second client can take the key inside it.
            timed(&mut c);
            c.base.timing.ttl = 3;
            c.base.timing.margin = 1;
            c.clock_step = if bound.ends_with("past-margin") { 2 } else { 1 };
            return Some(c);
        }
        "redlock-fast-clock-step-back" => {
            // A node clock stepping back by more than any margin (the
            // guard keeps none here): the node's copy lasts longer and its
            // TIME reads lower, while the guards' windows run on the
            // clients' clocks, which do not step.
            timed(&mut c);
            c.clock_step = 2;
            c.clock_step_back = true;
            if deep {
                // Every moment and every node with a copy: the full
                // search takes 30 s of CPU at the CI bound's ticks.
                c.base.horizon = 1;
            } else {
                // The step where it could harm: node 0 steps back right
                // after granting client 0 its copy at tick 0, while the
                // grant is still under way on the others.
                c.prefix = vec![
                    |s| *s == Step::Act(Act::Start(0)),
                    |s| matches!(s, Step::Deliver(Msg::Grant { c: 0, n: 0, .. })),
                    |s| *s == Step::Act(Act::ClockStep(0)),
                ];
            }
            return Some(c);
        }
        "redlock-fast-rejoin" => return Some(rejoin(deep)),
        "redlock-fast-stale-restart" => c.stale_restarts = true,
        "redlock-fast-formation" => {
            // The race `docs/redlock.md` names: both clients probe first
            // on a set never formed, each sees every node empty and sends
            // the marks of a new set; client 1's reach every node, it
            // probes again and is granted by nodes 0 and 1, and node 0
            // restarts, while client 0's marks are still in flight.
            c.unformed_start = true;
            c.knowing = 0;
            c.probes = 2;
            c.prefix = vec![
                |s| *s == Step::Act(Act::Start(0)),
                |s| *s == Step::Act(Act::Probe(0, 0b111)),
                |s| *s == Step::Act(Act::Start(1)),
                |s| *s == Step::Act(Act::Probe(1, 0b111)),
                |s| matches!(s, Step::Deliver(Msg::Mark { n: 0, .. })),
                |s| matches!(s, Step::Deliver(Msg::Mark { n: 1, .. })),
                |s| matches!(s, Step::Deliver(Msg::Mark { n: 2, .. })),
                |s| *s == Step::Act(Act::Probe(1, 0b111)),
                |s| matches!(s, Step::Deliver(Msg::Grant { c: 1, n: 0, .. })),
                |s| matches!(s, Step::Deliver(Msg::Grant { c: 1, n: 1, .. })),
                |s| *s == Step::Act(Act::Restart(0)),
            ];
        }
        "redlock-fast" => {}
        "redlock-fast-probing" => {
            // A client that probes first, so that a node that lost its
            // data rejoins while the other's grant runs.
            c.knowing = 1;
            c.probes = 2;
        }
        "redlock-fast-releasing" => {
            // Two clients that guess their tokens from the same clock
            // reading and release: only the nodes' check keeps the second
            // one's token above the first's.
            c.rounds = 2;
            c.releases = true;
            c.base.restarts = 0;
        }
        _ => return None,
    }
    if deep {
        // A restart while leases end with time.
        ticking(&mut c.base.timing);
        c.base.horizon = 1;
    }
    Some(c)
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
fn rejoin(deep: bool) -> redlock_fast::Config {
    let mut c = redlock_fast::Config::small();
    c.base.clients = 3;
    c.knowing = 2;
    c.lagging_clocks = true;
    ticking(&mut c.base.timing);
    c.base.horizon = if deep { 3 } else { 2 };
    c.prefix = vec![
        |s| *s == Step::Act(Act::Start(0)),
        |s| matches!(s, Step::Deliver(Msg::Grant { c: 0, n: 0, .. })),
        |s| matches!(s, Step::Deliver(Msg::Grant { c: 0, n: 1, .. })),
        |s| *s == Step::Act(Act::Restart(1)),
        |s| *s == Step::Act(Act::Start(2)),
        |s| *s == Step::Act(Act::Probe(2, 0b111)),
        |s| matches!(s, Step::Deliver(Msg::Mark { n: 1, .. })),
    ];
    c
}
