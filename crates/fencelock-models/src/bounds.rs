//! The named bounds the tests and `examples/check.rs` use, one place.

use crate::{
    common::{run, Outcome},
    election::{self, Election},
    redlock::{self, Redlock},
    sharding::{self, Resharding},
};

/// Checks `model` (`redlock`, `redlock-fast`, …, `-broken` for the twin)
/// at the small bound or the deep one; `None` for an unknown name.
pub fn check(model: &str, deep: bool, threads: usize) -> Option<Outcome> {
    let (name, broken) = match model.strip_suffix("-broken") {
        Some(name) => (name, true),
        None => (model, false),
    };
    Some(match name {
        "redlock" | "redlock-fast" => {
            let mut c = redlock::Config::small();
            if name == "redlock-fast" {
                c.return_at_majority = true;
                c.skip_timed_out = true;
            }
            if deep {
                c.horizon = 2;
                c.probe_losses = true;
            }
            c.quarantine = !broken;
            run(Redlock(c), threads, broken)
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
