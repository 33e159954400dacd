//! Every model at the small bound (the one CI runs): its safety properties
//! hold in every state reached and its liveness sanity properties are
//! reached; its broken twin has a counterexample, so that the model cannot
//! pass by being vacuous. `examples/check.rs` runs the deeper bound of
//! `docs/safety.md`.

use fencelock_models::{bounds, common::Outcome};

fn check(model: &str) -> Outcome {
    let outcome = bounds::check(model, false, 2).expect("a model of bounds.rs");
    eprintln!(
        "{model}: {} unique states, depth {}",
        outcome.unique_states, outcome.max_depth
    );
    outcome
}

/// The model holds `always` everywhere and reaches each of `sometimes`.
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

/// The twin breaks `property`.
fn breaks(model: &str, property: &str) {
    let outcome = check(model);
    let path = outcome.discovery(property);
    assert!(
        path.is_some(),
        "{model}: no counterexample to \"{property}\""
    );
    eprintln!(
        "{model}: \"{property}\" broken by\n{}",
        path.unwrap_or_default()
    );
}

#[test]
fn redlock_keeps_exclusion_and_token_order() {
    holds(
        "redlock",
        &["exclusion", "tokens increase"],
        &["a grant", "a grant after a restart"],
    );
}

#[test]
fn redlock_without_quarantine_lets_two_clients_hold() {
    breaks("redlock-broken", "exclusion");
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
fn redlock_trusting_the_whole_ttl_lets_two_clients_hold() {
    breaks("redlock-timed-broken", "exclusion");
}

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

#[test]
fn fast_redlock_trusting_the_whole_ttl_lets_two_clients_hold() {
    breaks("redlock-fast-timed-broken", "exclusion");
}

#[test]
fn fast_redlock_without_quarantine_lets_two_clients_hold() {
    breaks("redlock-fast-broken", "exclusion");
}

#[test]
fn fast_redlock_without_the_token_check_regresses_tokens() {
    breaks("redlock-fast-unchecked-broken", "tokens increase");
}

/// The rule `heal` had until this model refuted it: a node that lost its
/// data joined without quarantine a formed majority that had never
/// granted anything, while a grant it had made could still complete.
#[test]
fn fast_redlock_joining_a_majority_that_never_granted_at_once_lets_two_clients_hold() {
    breaks("redlock-fast-fresh-join-broken", "exclusion");
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
fn resharding_without_handover_regresses_tokens() {
    breaks("sharding-broken", "tokens increase");
}

#[test]
fn election_has_one_leader_and_growing_terms() {
    holds(
        "election",
        &["one leader", "terms increase"],
        &["a second term", "a renewal"],
    );
}

#[test]
fn election_without_the_i5_window_has_two_leaders() {
    breaks("election-broken", "one leader");
}
