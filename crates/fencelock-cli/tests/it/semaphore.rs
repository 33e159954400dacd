//! `fencelock acquire|run KEY --permits N`: semaphore permits from the
//! shell, on the default SQLite store.
//!
//! Time: real processes. Each test whose permits must stay held through
//! its later commands measures a
//! [`Patience`](fencelock_testkit::Patience) first and gives them a TTL
//! scaled from [`LEASE`] (the CLI's default); the ten racing runs' wait is
//! scaled from 60 s; a failure names the budget. A `--wait` that must run
//! out (`300ms` on a full semaphore) keeps its figure.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{process::Stdio, time::Duration};

use support::{acquired_key, code, field, ms, patience, stderr, stdout, Store};

/// The base of a permit's lease that must outlast the test's commands.
const LEASE: Duration = Duration::from_secs(30);

#[test]
fn acquire_with_permits_prints_the_permit_key_and_token() {
    let s = Store::new();
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let take = [
        "acquire",
        "S",
        "--permits",
        "2",
        "--owner",
        "a",
        "--ttl",
        ttl.as_str(),
    ];
    let first = s.run(&take);
    assert_eq!(acquired_key(&first), "fencelock/semaphore/S/0");
    assert_eq!(field(&first, "permit"), "0/2");
    let second = s.run(&take);
    assert_eq!(acquired_key(&second), "fencelock/semaphore/S/1");
    assert_eq!(field(&second, "permit"), "1/2");
    let t1: u64 = field(&second, "token").parse().unwrap();

    let full = s.run(&["acquire", "S", "--permits", "2"]);
    assert_eq!(code(&full), 75, "{} [{p}]", stderr(&full));
    assert!(
        stderr(&full).contains("all 2 permits of S were held"),
        "{}",
        stderr(&full)
    );

    // The printed key, owner and token are what `release` takes.
    let released = s.run(&[
        "release",
        "fencelock/semaphore/S/1",
        "--owner",
        "a",
        "--token",
        &t1.to_string(),
    ]);
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    let again = s.run(&["--json", "acquire", "S", "--permits", "2"]);
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(shown["key"], "fencelock/semaphore/S/1");
    assert_eq!(shown["semaphore"], "S");
    assert_eq!(shown["permit"], 1);
    assert_eq!(shown["permits"], 2);
    assert!(shown["token"].as_u64().unwrap() > t1, "{shown}");
}

#[test]
fn another_number_of_permits_is_a_usage_error() {
    let s = Store::new();
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    field(
        &s.run(&["acquire", "S", "--permits", "2", "--ttl", &ttl]),
        "token",
    );
    for n in ["3", "1"] {
        let out = s.run(&["acquire", "S", "--permits", n]);
        assert_eq!(code(&out), 2, "{} [{p}]", stderr(&out));
        let expected = format!("semaphore S has 2 permits, not {n}");
        assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
    }
    for bad in ["0", "10001", "many"] {
        let out = s.run(&["acquire", "T", "--permits", bad]);
        assert_eq!(code(&out), 2, "--permits {bad}: {}", stderr(&out));
    }
}

#[test]
fn another_number_of_permits_beside_a_permit_off_slot_0_is_a_usage_error() {
    let s = Store::new();
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let take = [
        "acquire",
        "S",
        "--permits",
        "2",
        "--owner",
        "a",
        "--ttl",
        ttl.as_str(),
    ];
    let first = s.run(&take);
    let second = s.run(&take);
    assert_eq!(acquired_key(&second), "fencelock/semaphore/S/1");
    let released = s.run(&[
        "release",
        "fencelock/semaphore/S/0",
        "--owner",
        "a",
        "--token",
        &field(&first, "token"),
    ]);
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    // Slot 0 is free: a mutex (`--permits 1`) finds its only slot free and
    // must still see the permit of 2 on slot 1.
    for args in [
        &["acquire", "S", "--permits", "1"][..],
        &["run", "S", "--permits", "1", "--", "true"][..],
    ] {
        let out = s.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {} [{p}]", stderr(&out));
        assert!(
            stderr(&out).contains("semaphore S has 2 permits, not 1"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            code(&s.run(&["inspect", "fencelock/semaphore/S/0"])),
            1,
            "{args:?} left slot 0 held"
        );
    }
}

#[test]
fn permits_with_several_keys_is_refused_and_takes_nothing() {
    let s = Store::new();
    // The store first, for `inspect` below (which reads, and creates nothing).
    assert_eq!(code(&s.run(&["cleanup"])), 0);
    let out = s.run(&["run", "A", "B", "--permits", "2", "--", "true"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--permits"), "{err}");
    for key in ["A", "B", "fencelock/semaphore/A/0"] {
        assert_eq!(code(&s.run(&["inspect", key])), 1, "{key} is held");
    }
}

#[test]
fn run_with_permits_passes_the_permit_and_releases_it() {
    let s = Store::new();
    let out = s.run(&[
        "run",
        "S",
        "--permits",
        "1",
        "--",
        "sh",
        "-c",
        "echo \"$FENCELOCK_KEY $FENCELOCK_TOKEN $FENCELOCK_KEYS\"; exit 3",
    ]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let printed = stdout(&out);
    let fields: Vec<&str> = printed.split(' ').collect();
    assert_eq!(fields[0], "fencelock/semaphore/S/0", "{printed}");
    assert!(fields[1].parse::<u64>().is_ok(), "{printed}");
    assert_eq!(fields[2], "fencelock/semaphore/S/0", "{printed}");
    assert_eq!(code(&s.run(&["inspect", "fencelock/semaphore/S/0"])), 1);

    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    field(
        &s.run(&["acquire", "S", "--permits", "1", "--ttl", &ttl]),
        "token",
    );
    let out = s.run(&[
        "run",
        "S",
        "--permits",
        "1",
        "--wait",
        "300ms",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 75, "{} [{p}]", stderr(&out));
}

/// Ten processes share three permits: each records how many permit files
/// exist while it holds one (a file lives only inside its holder's permit).
#[test]
fn concurrent_runs_never_exceed_the_permits() {
    let s = Store::new();
    // The store first (`cleanup` writes; `list` only reads).
    assert_eq!(code(&s.run(&["cleanup"])), 0);
    let slots = s.dir.path().join("holding");
    std::fs::create_dir(&slots).unwrap();
    let seen = s.dir.path().join("seen");
    let script = format!(
        "touch {slots}/$$; ls {slots} | wc -l >> {seen}; sleep 0.2; rm {slots}/$$",
        slots = slots.display(),
        seen = seen.display()
    );
    // Covers the nine turns before the last one's.
    let p = patience();
    let wait = ms(p.bound(Duration::from_secs(60)));
    let children: Vec<_> = (0..10)
        .map(|_| {
            s.command(&[
                "run",
                "S",
                "--permits",
                "3",
                "--wait",
                &wait,
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{} [{p}]", stderr(&out));
    }
    let counts: Vec<u32> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 10, "{counts:?}");
    assert!(counts.iter().all(|&c| (1..=3).contains(&c)), "{counts:?}");
}
