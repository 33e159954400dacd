//! `--hold-at-least`: a lock delay from the shell, on the default SQLite
//! store.
//!
//! Time: real processes. The delay (base [`DELAY`]) and the lease that
//! carries it (30 s) are scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first, so that the
//! checks right after `run` returns fall inside the delay on a busy
//! machine too; they still run only while it lasts (past it, the key is
//! rightly free). A failure names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::time::{Duration, Instant};

use support::{code, field, ms, patience, stderr, Store};

/// The base of the delay: long enough that the checks right after `run`
/// returns fall inside it.
const DELAY: Duration = Duration::from_secs(20);

#[test]
fn run_keeps_the_key_for_the_delay_after_the_command_ends() {
    let s = Store::new();
    let p = patience();
    let delay = p.bound(DELAY);
    let (ttl, hold) = (ms(p.ttl(Duration::from_secs(30))), ms(delay));
    let started = Instant::now();
    let out = s.run(&[
        "run",
        "k",
        "--ttl",
        &ttl,
        "--hold-at-least",
        &hold,
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = s.run(&["inspect", "k"]);
    let other = s.run(&["acquire", "k", "--owner", "other"]);
    if started.elapsed() < delay {
        assert_eq!(
            code(&shown),
            0,
            "released at once: {} [{p}]",
            stderr(&shown)
        );
        assert_eq!(
            code(&other),
            75,
            "another owner took it inside the delay [{p}]"
        );
    }
    // Without a delay, the same run frees the key at once.
    let out = s.run(&["run", "free", "--ttl", "30s", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(code(&s.run(&["inspect", "free"])), 1, "free still held");
    field(&s.run(&["acquire", "free", "--owner", "other"]), "token");
}

#[test]
fn bad_delays_are_usage_errors() {
    let s = Store::new();
    for args in [
        &[
            "run",
            "k",
            "--ttl",
            "5s",
            "--hold-at-least",
            "6s",
            "--",
            "true",
        ][..],
        &["acquire", "k", "--ttl", "5s", "--hold-at-least", "0s"][..],
        &["acquire", "k", "--permits", "2", "--hold-at-least", "1s"][..],
    ] {
        let out = s.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
    assert_eq!(code(&s.run(&["inspect", "k"])), 1, "a refused call took k");
}
