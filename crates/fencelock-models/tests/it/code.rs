//! The models follow the code: the Redlock bounds explore no more rounds
//! and probes than `crates/fencelock-redlock` runs, and the formulas the
//! models' timing is written from (`common::Timing`: the validity check
//! `elapsed + drift < ttl`, a guard that trusts a grant for at most
//! `ttl − drift` from its call, a quarantine of `max_ttl + drift`) are the
//! code's, read from its `protocol` module. A change to one that the other
//! does not follow fails here.

use std::time::Duration;

use fencelock_core::ClockPolicy;
use fencelock_models::bounds::{self, BOUNDS};
use fencelock_redlock::protocol::{self, drift, validity, PROBES, ROUNDS};

#[test]
fn no_bound_runs_more_rounds_or_probes_than_the_code() {
    let mut fast = 0;
    for bound in BOUNDS {
        for deep in [false, true] {
            let Some(c) = bounds::redlock_fast(bound, deep) else {
                continue;
            };
            fast += 1;
            assert!(
                usize::from(c.rounds) <= ROUNDS && usize::from(c.probes) <= PROBES,
                "{bound}: {} rounds and {} probes, the code {ROUNDS} and {PROBES}",
                c.rounds,
                c.probes
            );
        }
    }
    assert!(fast > 0, "no redlock-fast bound in bounds::BOUNDS");
}

#[test]
fn the_models_timing_is_the_codes() {
    let ms = Duration::from_millis;
    for ttl in [ms(10), ms(1_000), ms(2_000), ms(60_000)] {
        assert_eq!(
            protocol::quarantine(ttl),
            ttl + drift(ttl),
            "Q = max_ttl + drift"
        );
        for tenth in 0..=10 {
            let elapsed = ttl * tenth / 10;
            let left = validity(ttl, elapsed);
            assert_eq!(
                left.is_some(),
                elapsed + drift(ttl) < ttl,
                "the validity check at {elapsed:?} of {ttl:?}"
            );
            // The guard of a grant trusts its validity from before the
            // call: never longer than `ttl − drift` from the call.
            if let Some(left) = left {
                assert!(
                    ClockPolicy::default().valid_for(left) + elapsed <= ttl - drift(ttl),
                    "a guard trusts {elapsed:?} into {ttl:?} past ttl − drift"
                );
            }
        }
    }
}
