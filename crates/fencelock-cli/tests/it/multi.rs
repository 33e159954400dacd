//! `fencelock run K1 K2 … -- CMD`: several keys, all or none, from the
//! shell, on the default SQLite store.
//!
//! Time: real processes. A lease that must last until the test ends it
//! (the other owner's, the force-released run's: base 30 s and 3 s) and
//! the wait for the run's command to start (20 s) are scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first; a failure
//! names the budget. A `--wait` that must run out (`300ms` on a held key)
//! keeps its figure.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{process::Stdio, time::Duration};

use support::{code, field, ms, patience, stderr, stdout, Store, BIN};

#[test]
fn run_holds_every_key_and_exports_each_token_in_sorted_order() {
    let s = Store::new();
    // The command checks that both keys are held while it runs.
    let script = format!(
        "{BIN} inspect a >/dev/null && {BIN} inspect 'b key' >/dev/null || exit 9; \
         printf '%s|%s|%s|%s' \"$FENCELOCK_KEY\" \"$FENCELOCK_TOKEN\" \
         \"$FENCELOCK_KEYS\" \"$FENCELOCK_TOKENS\""
    );
    let out = s.run(&["run", "b key", "a", "a", "--", "sh", "-c", &script]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = stdout(&out);
    let parts: Vec<&str> = printed.split('|').collect();
    assert_eq!(parts[0], "a", "{printed}");
    assert_eq!(parts[2], "a\nb key", "{printed}");
    let tokens: Vec<u64> = parts[3].lines().map(|t| t.parse().unwrap()).collect();
    assert_eq!(tokens.len(), 2, "{printed}");
    assert_eq!(parts[1], tokens[0].to_string(), "{printed}");
    for key in ["a", "b key"] {
        assert_eq!(code(&s.run(&["inspect", key])), 1, "{key} still held");
    }
}

#[test]
fn run_exits_75_when_any_key_is_held_and_keeps_none() {
    let s = Store::new();
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(30)));
    field(
        &s.run(&["acquire", "b", "--owner", "other", "--ttl", &ttl]),
        "token",
    );
    let out = s.run(&["run", "c", "a", "b", "--wait", "300ms", "--", "true"]);
    assert_eq!(code(&out), 75, "{} [{p}]", stderr(&out));
    assert!(
        stderr(&out).contains("b is held by other"),
        "{}",
        stderr(&out)
    );
    for key in ["a", "c"] {
        assert_eq!(code(&s.run(&["inspect", key])), 1, "{key} stayed held");
    }
}

#[test]
fn losing_one_key_stops_the_command() {
    let s = Store::new();
    let started = s.dir.path().join("started");
    let script = format!("echo yes > {}; sleep 60", started.display());
    // Both keys renewed in time until the force-release, so that the loss
    // is that.
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(3)));
    let holder = s
        .command(&[
            "run",
            "x",
            "y",
            "--ttl",
            &ttl,
            "--kill-after",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    s.wait_for_file(&started, &p);
    let forced = s.run(&["force-release", "y"]);
    assert_eq!(code(&forced), 0, "{} [{p}]", stderr(&forced));
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 76, "{} [{p}]", stderr(&out));
    assert!(
        stderr(&out).contains("lost lock y"),
        "{} [{p}]",
        stderr(&out)
    );
    assert_eq!(code(&s.run(&["inspect", "x"])), 1, "x stayed held");
}
