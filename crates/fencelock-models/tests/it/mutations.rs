//! The mutation suite: every planted bug of `bounds::MUTANTS`, planted
//! alone in its model, must be caught at the small size of its bound, the
//! one `models.rs` checks the model itself at. A bug that survives is a
//! line of a model that no check of CI depends on.
//!
//! One checker thread: a depth-first search on one thread is
//! deterministic, so that each bug breaks the same property after the
//! same states on every run (on two, a thread may find another property's
//! counterexample first and stop). `.ci/parallel-tests` runs this module
//! beside `models.rs`.

use fencelock_models::bounds::{self, MUTANTS};

#[test]
fn every_planted_bug_is_caught() {
    let mut survivors = Vec::new();
    for m in MUTANTS {
        let outcome =
            bounds::check(m.bound, false, Some(m.plant), 1).expect("a bound of bounds.rs");
        match outcome.discovery(m.breaks) {
            Some(path) => eprintln!(
                "{} on {}: \"{}\" broken after {} states, by\n{path}\n",
                m.plant.name(),
                m.bound,
                m.breaks,
                outcome.unique_states
            ),
            None => survivors.push(format!(
                "{} on {} ({} states, found {:?})",
                m.plant.name(),
                m.bound,
                outcome.unique_states,
                outcome
                    .discoveries
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
            )),
        }
    }
    assert!(
        survivors.is_empty(),
        "planted bugs survived: {survivors:#?}"
    );
}
