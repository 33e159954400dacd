//! SQLite leases across Linux time namespaces: a process whose boot-time
//! clock is offset (`unshare -T --boottime N`) must judge leases exactly as
//! the rest of the host does (I1 and I4 in `docs/semantics.md`).
//!
//! These tests need `unshare -T`, i.e. root (or CAP_SYS_ADMIN) and a kernel
//! with time namespaces. Without them they fail with the reason: a skipped
//! test would hide a double grant.
//!
//! Time: real processes. The first lease must outlast the second process's
//! start, so its TTL is scaled from 60 s by a
//! [`Patience`](fencelock_testkit::Patience) measured first (at most 16
//! minutes, still far inside the offset); a failure names the budget.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Far beyond the lease (60 s, scaled): a clock offset by this much sees
/// the lease long expired, or renewed in its far future.
const OFFSET_SECS: &str = "3600";

/// `fencelock acquire KEY --ttl TTL`, optionally inside a fresh time
/// namespace whose boot-time clock runs `OFFSET_SECS` ahead.
fn acquire(db: &Path, owner: &str, in_namespace: bool, ttl: &str) -> Output {
    let mut cmd = if in_namespace {
        let mut cmd = Command::new("unshare");
        cmd.args(["-T", "--boottime", OFFSET_SECS, BIN]);
        cmd
    } else {
        Command::new(BIN)
    };
    cmd.env("FENCELOCK_URL", format!("sqlite://{}", db.display()))
        .env_remove("RUST_LOG")
        .args([
            "acquire", "k", "--ttl", ttl, "--wait", "0s", "--owner", owner,
        ]);
    cmd.output().expect("the command starts")
}

/// Fails the test, with the reason, when this host cannot make time
/// namespaces.
fn require_time_namespaces() {
    let probe = Command::new("unshare")
        .args([
            "-T",
            "--boottime",
            OFFSET_SECS,
            "cat",
            "/proc/self/timens_offsets",
        ])
        .output();
    match probe {
        Ok(out) if out.status.success() => {
            let offsets = String::from_utf8_lossy(&out.stdout);
            assert!(
                offsets
                    .lines()
                    .any(|l| l.split_whitespace().eq(["boottime", OFFSET_SECS, "0"])),
                "unshare -T --boottime {OFFSET_SECS} did not set the offset: {offsets}"
            );
        }
        Ok(out) => panic!(
            "this test needs `unshare -T` (root or CAP_SYS_ADMIN, and a kernel with time \
             namespaces); it failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("this test needs util-linux's `unshare` on PATH: {e}"),
    }
}

fn check_order(first_in_namespace: bool) {
    require_time_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(60)));
    let first = acquire(&db, "first", first_in_namespace, &ttl);
    assert_eq!(
        first.status.code(),
        Some(0),
        "the first acquire failed: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = acquire(&db, "second", !first_in_namespace, &ttl);
    assert_eq!(
        second.status.code(),
        Some(75),
        "a process {} the time namespace took a key held for {ttl} by one {} it \
         (stdout {:?}, stderr {:?}) [{p}]",
        if first_in_namespace {
            "outside"
        } else {
            "inside"
        },
        if first_in_namespace {
            "inside"
        } else {
            "outside"
        },
        String::from_utf8_lossy(&second.stdout).trim(),
        String::from_utf8_lossy(&second.stderr).trim(),
    );
}

#[test]
fn namespaced_process_cannot_take_a_key_held_outside() {
    check_order(false);
}

#[test]
fn process_outside_cannot_take_a_key_held_in_a_namespace() {
    check_order(true);
}
