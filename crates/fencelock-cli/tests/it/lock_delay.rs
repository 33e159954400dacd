//! `--hold-at-least`: a lock delay from the shell, on the default SQLite
//! store.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::time::{Duration, Instant};

use support::{code, field, stderr, Store};

/// Long enough that the checks right after `run` returns fall inside it
/// (they are skipped on a machine stalled that long).
const DELAY: Duration = Duration::from_secs(20);

#[test]
fn run_keeps_the_key_for_the_delay_after_the_command_ends() {
    let s = Store::new();
    let started = Instant::now();
    let out = s.run(&[
        "run",
        "k",
        "--ttl",
        "30s",
        "--hold-at-least",
        "20s",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = s.run(&["inspect", "k"]);
    let other = s.run(&["acquire", "k", "--owner", "other"]);
    if started.elapsed() < DELAY {
        assert_eq!(code(&shown), 0, "released at once: {}", stderr(&shown));
        assert_eq!(code(&other), 75, "another owner took it inside the delay");
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
