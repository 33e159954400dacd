//! Every bound at its small size (the one CI runs): its safety properties
//! hold in every state reached and its liveness sanity properties are
//! reached. `mutations.rs` plants bugs in the same bounds, so that no
//! model passes by being vacuous; `examples/check.rs` runs the deeper
//! bounds of `docs/safety.md`.

use fencelock_models::{bounds, common::Outcome};

fn check(model: &str) -> Outcome {
    let outcome = bounds::check(model, false, None, 2).expect("a bound of bounds.rs");
    eprintln!(
        "{model}: {} unique states, depth {}",
        outcome.unique_states, outcome.max_depth
    );
    outcome
}

/// The model holds `always` everywhere (and `eventually` at the end of
/// every path) and reaches each of `sometimes`.
fn holds(model: &str, always: &[&str], sometimes: &[&str]) {
    let outcome = check(model);
    for name in always {
        assert!(
            outcome.discovery(name).is_none(),
            "{model}: \"{name}\" broken:\n{}",
            outcome.discovery(name).unwrap_or_default()
        );
    }
    for name in sometimes {
        assert!(
            outcome.discovery(name).is_some(),
            "{model}: \"{name}\" never reached: the bound shows nothing"
        );
    }
}

#[test]
fn redlock_keeps_exclusion_and_token_order() {
    holds(
        "redlock",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a restart"],
    );
}

/// Leases that end with time: a client trusts its grant for
/// `ttl − drift` from its request, so a node whose clock runs fast ends
/// its copy no earlier, and the next client's grant comes after the trust.
#[test]
fn redlock_keeps_exclusion_while_leases_end() {
    holds(
        "redlock-timed",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a lease ended"],
    );
}

/// The margin dropped: the client trusts the whole TTL from its request,
/// past the end of the copy a fast node granted.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order() {
    holds(
        "redlock-fast",
        &["exclusion", "tokens increase"],
        // "a grant after a stale answer" needs a second round: the
        // bound with time's.
        &["a grant", "a grant after a restart"],
    );
}

#[test]
fn fast_redlock_keeps_exclusion_and_token_order_while_leases_end() {
    holds(
        "redlock-fast-timed",
        &["exclusion", "tokens increase"],
        &[
            "a grant",
            "a grant after a lease ended",
            "a grant after a stale answer",
        ],
    );
}

/// The rule `heal` had until this model refuted it: a node that lost its
/// data joined without quarantine a formed majority that had never
/// granted anything, while a grant it had made could still complete.
/// A client that probes first, so that a node that lost its data rejoins
/// while the other client's grant is under way.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_with_a_client_that_probes() {
    holds(
        "redlock-fast-probing",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a restart"],
    );
}

/// Clients that release and ask again above a `Stale` answer.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_with_releases() {
    holds(
        "redlock-fast-releasing",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a stale answer"],
    );
}

/// Every mix of fast and slow node clocks.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_with_mixed_clock_rates() {
    holds(
        "redlock-fast-mixed-clocks",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a lease ended"],
    );
}

/// A node clock that steps forward by the guard's margin.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_through_a_clock_step_within_the_margin() {
    holds(
        "redlock-fast-clock-step",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a lease ended"],
    );
}

/// A node clock that steps back: its copy lasts longer and its TIME
/// reads lower, while the guards trust on the clients' own clocks.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_through_a_clock_step_back() {
    holds(
        "redlock-fast-clock-step-back",
        &["exclusion", "tokens increase"],
        &[
            "a grant",
            "a grant after a lease ended",
            "a grant after a stale answer",
        ],
    );
}

/// Past the assumptions of `docs/redlock.md` the model shows what breaks:
/// a clock step beyond the margin, a restart that keeps its marker but
/// lost its last writes, the race at a set's first formation.
#[test]
fn past_its_assumptions_fast_redlock_lets_two_clients_hold() {
    for (bound, property) in bounds::LIMITS {
        let outcome = check(bound);
        let path = outcome.discovery(property);
        assert!(
            path.is_some(),
            "{bound}: no counterexample to \"{property}\""
        );
        eprintln!(
            "{bound}: \"{property}\" broken by\n{}",
            path.unwrap_or_default()
        );
    }
}

/// A node that lost a lease rejoins and votes again once its quarantine
/// has ended, while a client with a lagging clock proposes an old token.
#[test]
fn fast_redlock_keeps_exclusion_and_token_order_past_a_quarantine() {
    holds(
        "redlock-fast-rejoin",
        &["exclusion", "tokens increase"],
        &["a grant", "a rejoined node's vote"],
    );
}

#[test]
fn resharding_keeps_exclusion_and_token_order() {
    holds(
        "sharding",
        &["exclusion", "tokens increase"],
        &["a grant on the new map"],
    );
}

#[test]
fn election_has_one_leader_and_growing_terms() {
    holds(
        "election",
        &["one leader", "terms increase"],
        &["a second term", "a renewal"],
    );
}

/// Holders that pause and writes that are delayed and reordered: the
/// fence admits no token below one it admitted, and only its holder's;
/// once faults stop, every waiter is granted.
#[test]
fn the_fence_refuses_stale_writes_and_every_waiter_is_granted() {
    holds(
        "fence",
        &[
            "no stale write admitted",
            "admitted tokens were granted",
            "every acquisition granted",
        ],
        &["a stale write refused", "a write admitted after a restart"],
    );
}
