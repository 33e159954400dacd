//! `fencelock acquire|run KEY --shared`: the reader's side of a read-write
//! lock from the shell, on the default SQLite store.
//!
//! Time: real processes. Each test measures a
//! [`Patience`](fencelock_testkit::Patience) first and scales from it the
//! leases that must outlast its commands (base [`LEASE`]), the waits that
//! must cover another holder's turn, and its bounds, the shell's own
//! included (bases beside each); a failure names the budget. A `--wait`
//! that must run out (`200ms` while readers hold) keeps its figure.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::time::{Duration, Instant};

use support::{code, field, ms, patience, stderr, stdout, Store};

/// The base of a lease that must outlast the test's commands.
const LEASE: Duration = Duration::from_secs(60);

fn json(out: &std::process::Output) -> serde_json::Value {
    assert_eq!(code(out), 0, "{}", stderr(out));
    serde_json::from_str(&stdout(out)).unwrap()
}

/// Two `--shared` holders at once; an exclusive acquire or run is refused
/// while they hold; inspect and list show both as readers; once they are
/// released by (owner, token, --shared), the exclusive holder gets a higher
/// token and excludes readers.
#[test]
fn two_shared_holders_at_once_and_the_exclusive_is_refused() {
    let s = Store::new();
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let a = s.run(&["acquire", "K", "--shared", "--owner", "a", "--ttl", &ttl]);
    let b = s.run(&["acquire", "K", "--shared", "--owner", "b", "--ttl", &ttl]);
    assert_eq!(field(&a, "mode"), "shared");
    let (ta, tb): (u64, u64) = (
        field(&a, "token").parse().unwrap(),
        field(&b, "token").parse().unwrap(),
    );
    assert!(tb > ta, "{ta} {tb}");

    let exclusive = s.run(&["acquire", "K"]);
    assert_eq!(code(&exclusive), 75, "{} [{p}]", stderr(&exclusive));
    assert!(
        stderr(&exclusive).contains("read-held by"),
        "{}",
        stderr(&exclusive)
    );
    let run = s.run(&["run", "K", "--wait", "200ms", "--", "true"]);
    assert_eq!(code(&run), 75, "{}", stderr(&run));

    let shown = json(&s.run(&["--json", "inspect", "K"]));
    assert_eq!(shown["mode"], "shared", "{shown}");
    let holders: Vec<u64> = shown["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["token"].as_u64().unwrap())
        .collect();
    assert_eq!(holders, [ta, tb], "{shown} [{p}]");
    let listed = json(&s.run(&["--json", "list", "K"]));
    let modes: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["shared", "shared"], "{listed}");

    // A reader lease is released as a reader's, by its exact owner and token.
    let (ta, tb) = (ta.to_string(), tb.to_string());
    let plain = s.run(&["release", "K", "--owner", "a", "--token", &ta]);
    assert_eq!(code(&plain), 1, "{}", stderr(&plain));
    let stranger = s.run(&["release", "K", "--owner", "b", "--token", &ta, "--shared"]);
    assert_eq!(code(&stranger), 1, "{}", stderr(&stranger));
    for (owner, token) in [("a", &ta), ("b", &tb)] {
        let out = s.run(&[
            "release", "K", "--owner", owner, "--token", token, "--shared",
        ]);
        assert_eq!(code(&out), 0, "{} [{p}]", stderr(&out));
    }
    let writer = s.run(&["--json", "acquire", "K", "--ttl", &ttl]);
    let writer = json(&writer);
    assert_eq!(writer["mode"], "exclusive");
    assert!(writer["token"].as_u64().unwrap() > tb.parse::<u64>().unwrap());
    let reader = s.run(&["acquire", "K", "--shared"]);
    assert_eq!(code(&reader), 75, "{}", stderr(&reader));
}

/// Two `run --shared` children hold K at the same time: each waits, with
/// a bound, until the other is inside too, which only works if both hold
/// it at once. An exclusive run that waits is served after them, and while
/// it waits, new readers are refused (its intent).
#[test]
fn shared_runs_overlap_and_a_waiting_exclusive_run_stops_new_readers() {
    let s = Store::new();
    let dir = s.dir.path().display().to_string();
    let p = patience();
    // The shell's bounds, in its 50 ms rounds: 30 s (base) for the other
    // reader to come in, 60 s in all for the go.
    let rounds = |base: u64| p.bound(Duration::from_secs(base)).as_millis() / 50;
    let (meet, go) = (rounds(30), rounds(60));
    let rendezvous = format!(
        "touch {dir}/in-$$; i=0; \
         while [ \"$(ls {dir} | grep -c '^in-')\" -lt 2 ]; do \
           i=$((i+1)); [ $i -gt {meet} ] && exit 9; sleep 0.05; done; \
         while [ ! -e {dir}/go ]; do i=$((i+1)); [ $i -gt {go} ] && exit 8; sleep 0.05; done"
    );
    let reader_wait = ms(p.bound(Duration::from_secs(30)));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            s.command(&[
                "run",
                "K",
                "--shared",
                "--wait",
                &reader_wait,
                "--",
                "sh",
                "-c",
                &rendezvous,
            ])
            .spawn()
            .unwrap()
        })
        .collect();
    // Both readers are inside once both files exist.
    let deadline = Instant::now() + p.bound(Duration::from_secs(30));
    while std::fs::read_dir(s.dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("in-")
        })
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the two readers never overlapped [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let writer_wait = ms(p.bound(Duration::from_secs(60)));
    let ttl = ms(p.ttl(LEASE));
    let writer = s
        .command(&[
            "run",
            "K",
            "--wait",
            &writer_wait,
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_TOKEN",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the writer has posted its intent, a new reader is refused even
    // though only readers hold the key.
    let deadline = Instant::now() + p.bound(Duration::from_secs(30));
    loop {
        let late = s.run(&["acquire", "K", "--shared", "--ttl", &ttl]);
        if code(&late) == 75 {
            break;
        }
        let token = field(&late, "token");
        let out = s.run(&[
            "release",
            "K",
            "--owner",
            &field(&late, "owner"),
            "--token",
            &token,
            "--shared",
        ]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            Instant::now() < deadline,
            "new readers kept coming past a waiting writer [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = json(&s.run(&["--json", "inspect", "K"]));
    assert_eq!(held["holders"].as_array().unwrap().len(), 2, "{held}");
    std::fs::write(s.dir.path().join("go"), "").unwrap();
    for reader in readers {
        let out = reader.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{} [{p}]", stderr(&out));
    }
    let out = writer.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{} [{p}]", stderr(&out));
    let top = held["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["token"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        stdout(&out).parse::<u64>().unwrap() > top,
        "{}",
        stdout(&out)
    );
}

#[test]
fn shared_with_permits_or_several_keys_is_refused() {
    let s = Store::new();
    // The store first, for `inspect` below (which reads, and creates nothing).
    assert_eq!(code(&s.run(&["cleanup"])), 0);
    for args in [
        &["run", "K", "--shared", "--permits", "2", "--", "true"][..],
        &["run", "K", "L", "--shared", "--", "true"],
        &["acquire", "K", "--shared", "--permits", "2"],
    ] {
        let out = s.run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--shared"), "{}", stderr(&out));
    }
    assert_eq!(code(&s.run(&["inspect", "K"])), 1);
}
