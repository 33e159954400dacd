//! The `fencelock` binary, run as separate processes against one SQLite
//! file, as users run it.
//!
//! Time: real processes, so each test whose verdict needs a lease to
//! outlast its next commands, or a process to act within a bound, measures
//! a [`Patience`](fencelock_testkit::Patience) first and scales from it
//! the TTLs it passes (base [`LEASE`], 3 s for the force-released run) and
//! its bounds (bases beside each); a failure names the budget. A lease
//! that is meant to run out (300 ms, `-t 1s`) keeps its figure: it only
//! has to end, and the wait for that is a scaled bound. The `1m` of
//! `acquire_prints_owner_and_token_that_release_accepts` is the figure it
//! checks the printing of, and needs one command after it.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use fencelock_testkit::Patience;

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// The base of a lease that must outlast the test's next few commands
/// (the CLI's default TTL).
const LEASE: Duration = Duration::from_secs(30);

fn fencelock(db: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", format!("sqlite://{}", db.display()))
        .env_remove("RUST_LOG")
        .args(args);
    cmd
}

fn run(db: &Path, args: &[&str]) -> Output {
    fencelock(db, args).output().expect("fencelock runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `token=` field of `acquire`'s human line.
fn token(out: &Output) -> u64 {
    field(out, "token")
        .parse()
        .expect("acquire prints the token")
}

/// One `name=value` field of `acquire`'s human line
/// (`acquired KEY token=T owner=O expires_in=D`).
fn field(out: &Output, name: &str) -> String {
    assert_eq!(code(out), 0, "acquire failed: {}", stderr(out));
    let line = stdout(out);
    let prefix = format!("{name}=");
    line.split(' ')
        .find_map(|f| f.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .to_owned()
}

#[test]
fn fifty_concurrent_acquire_processes_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    // The winner's lease outlasts the other 49 processes' start-up.
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    // Create the schema first so the race is about the lock, not the DDL
    // (`cleanup` writes; `list` only reads, and creates nothing).
    assert_eq!(code(&run(&db, &["cleanup"])), 0);
    let children: Vec<_> = (0..50)
        .map(|_| {
            fencelock(&db, &["acquire", "K", "--ttl", &ttl, "--wait", "0s"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let codes: Vec<i32> = children
        .into_iter()
        .map(|c| code(&c.wait_with_output().unwrap()))
        .collect();
    assert_eq!(
        codes.iter().filter(|&&c| c == 0).count(),
        1,
        "{codes:?} [{p}]"
    );
    assert_eq!(
        codes.iter().filter(|&&c| c == 75).count(),
        49,
        "{codes:?} [{p}]"
    );
}

#[test]
fn tokens_grow_across_release_expiry_cleanup_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let t1 = token(&run(&db, &["acquire", "K", "--owner", "a", "--ttl", &ttl]));
    let released = run(
        &db,
        &["release", "K", "--owner", "a", "--token", &t1.to_string()],
    );
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    let t2 = token(&run(
        &db,
        &["acquire", "K", "--owner", "b", "--ttl", "300ms"],
    ));
    // Wait out the 300 ms lease: poll until it is free, bounded.
    let bound = p.bound(Duration::from_secs(10));
    let deadline = std::time::Instant::now() + bound;
    while code(&run(&db, &["inspect", "K"])) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "lease never expired within {bound:?} [{p}]"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let cleanup = run(&db, &["--json", "cleanup"]);
    assert_eq!(stdout(&cleanup), r#"{"removed":1}"#);
    let t3 = token(&run(&db, &["acquire", "K", "--owner", "c", "--ttl", &ttl]));
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
    // A stale holder cannot renew or release its successor's lease.
    let stale = run(
        &db,
        &["renew", "K", "--owner", "b", "--token", &t2.to_string()],
    );
    assert_eq!(code(&stale), 1);
    assert!(stderr(&stale).contains("not held"), "{}", stderr(&stale));
    let renewed = run(
        &db,
        &[
            "renew",
            "K",
            "--owner",
            "c",
            "--token",
            &t3.to_string(),
            "--ttl",
            "1m",
        ],
    );
    assert_eq!(code(&renewed), 0, "{} [{p}]", stderr(&renewed));
}

#[test]
fn run_passes_the_lock_to_the_command_and_its_exit_code_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let out = run(
        &db,
        &[
            "run",
            "job",
            "--owner",
            "me",
            "--",
            "sh",
            "-c",
            "echo \"$FENCELOCK_KEY $FENCELOCK_OWNER $FENCELOCK_TOKEN\"; exit 7",
        ],
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let printed = stdout(&out);
    let fields: Vec<&str> = printed.split(' ').collect();
    assert_eq!(fields[..2], ["job", "me"]);
    assert!(fields[2].parse::<u64>().is_ok(), "{printed}");
    // Released on exit.
    assert_eq!(code(&run(&db, &["inspect", "job"])), 1);
}

#[test]
fn run_exits_75_when_the_lock_is_held_and_reports_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    // The holder's lease outlasts the run's whole wait.
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    token(&run(
        &db,
        &["acquire", "job", "--owner", "holder", "--ttl", &ttl],
    ));
    let out = run(&db, &["run", "job", "--wait", "1500ms", "--", "true"]);
    assert_eq!(code(&out), 75, "{} [{p}]", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("waiting: job is held by holder"), "{err}");
    assert!(err.contains("not acquired"), "{err}");
}

#[test]
fn run_stops_the_command_when_the_lock_is_force_released() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let pidfile = dir.path().join("grandchild.pid");
    // A shell whose child would outlive it if only the shell were signalled.
    let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    // Renewed in time until the force-release, so that the loss is that.
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(3)));
    let holder = fencelock(
        &db,
        &[
            "run",
            "K",
            "--ttl",
            &ttl,
            "--kill-after",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + p.bound(Duration::from_secs(10));
    while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let forced = run(&db, &["force-release", "K"]);
    assert_eq!(code(&forced), 0, "{}", stderr(&forced));
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 76, "{} [{p}]", stderr(&out));
    let err = stderr(&out);
    let lost: Vec<&str> = err.lines().filter(|l| l.contains("lost")).collect();
    assert_eq!(lost.len(), 1, "{err} [{p}]");
    assert!(lost[0].contains("lost lock K"), "{err} [{p}]");
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = still_alive(grandchild, &p);
    assert!(!alive, "the command's child survived the loss [{p}]");
}

/// Whether `pid` still runs `patience.bound(5 s)` from now.
fn still_alive(pid: i32, patience: &Patience) -> bool {
    // kill -0 reports whether the process exists; a zombie reaped by init
    // disappears shortly after its parent dies.
    let deadline = std::time::Instant::now() + patience.bound(Duration::from_secs(5));
    loop {
        let exists = Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.split(") ")
                    .nth(1)
                    .is_some_and(|rest| rest.starts_with('Z'))
            })
            .unwrap_or(false);
        if !exists || zombie {
            return false;
        }
        if std::time::Instant::now() >= deadline {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_forwards_sigterm_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'exit 42' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let child = fencelock(&db, &["run", "K", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let p = patience();
    let deadline = std::time::Instant::now() + p.bound(Duration::from_secs(10));
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 42, "{}", stderr(&out));
    assert_eq!(code(&run(&db, &["inspect", "K"])), 1, "not released");
}

#[test]
fn bad_input_is_exit_2_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let cases: &[&[&str]] = &[
        &["acquire", "K", "--ttl", "-5s"],
        &["acquire", "K", "--ttl", "0s"],
        &["acquire", "K", "--ttl", "10"],
        &["acquire", "K", "--ttl", "100y"],
        &["acquire", ""],
        &["acquire", "a\u{1}b"],
        &["acquire", &"k".repeat(256)],
        &["acquire", "K", "--data", "{not json"],
        &["renew", "K", "--owner", "o", "--token", "-1"],
        &["--url", "nope", "list"],
        &["--url", "ftp://u:secret@h/x", "list"],
        &["--url", "sqlite://", "list"],
        &["run", "K"],
        &["frobnicate"],
        &["acquire", "K", "--ttl", "1ms"],
        &["acquire", "K", "--wait", "forevermore"],
    ];
    for args in cases {
        let out = run(&db, args);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(
            err.lines()
                .next()
                .is_some_and(|l| l.contains("error") || l.starts_with("fencelock: ")),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("secret"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn usage_errors_keep_the_whole_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let missing = run(&db, &["release", "k", "--token", "5"]);
    assert_eq!(code(&missing), 2);
    assert!(stderr(&missing).contains("--owner"), "{}", stderr(&missing));
    let typo = run(&db, &["lsit"]);
    assert_eq!(code(&typo), 2);
    let err = stderr(&typo);
    assert!(
        err.contains("similar subcommand") && err.contains("'list'"),
        "{err}"
    );
}

#[test]
fn ttls_below_the_minimum_are_usage_errors_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    for url in [format!("sqlite://{}", db.display()), "memory://".to_owned()] {
        for args in [
            &["acquire", "K", "--ttl", "1ms"][..],
            &["run", "K", "--ttl", "99ms", "--", "true"],
            &["renew", "K", "--owner", "o", "--token", "1", "--ttl", "1ms"],
        ] {
            let out = fencelock(&db, args)
                .env("FENCELOCK_URL", &url)
                .output()
                .unwrap();
            let err = stderr(&out);
            assert_eq!(code(&out), 2, "{url} {args:?}: {err}");
            assert!(err.contains("100ms"), "{url} {args:?}: {err}");
        }
    }
    // The minimum itself is accepted.
    let out = run(&db, &["acquire", "K", "--ttl", "100ms"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn acquire_prints_owner_and_token_that_release_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let out = run(&db, &["acquire", "job", "--ttl", "1m"]);
    let line = stdout(&out);
    assert!(line.starts_with("acquired job "), "{line}");
    assert_eq!(field(&out, "expires_in"), "1m", "{line}");
    let (owner, token) = (field(&out, "owner"), field(&out, "token"));
    let released = run(
        &db,
        &["release", "job", "--owner", &owner, "--token", &token],
    );
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    // --json carries the same, plus the effective TTL.
    let out = run(&db, &["--json", "acquire", "job", "--ttl", "2m"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["owner"].is_string() && v["token"].is_u64(), "{v}");
    assert_eq!(v["ttl_ms"], 120_000, "{v}");
}

#[test]
fn wait_forever_and_short_flags() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    for spelling in ["forever", "inf", "infinity"] {
        // Held for a second: a forever wait outlasts it and gets the lock.
        token(&run(&db, &["acquire", "K", "-t", "1s"]));
        let out = run(&db, &["-q", "run", "K", "-w", spelling, "--", "true"]);
        assert_eq!(code(&out), 0, "{spelling}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{spelling}: -q printed something");
    }
    // -t sets the TTL.
    let out = run(&db, &["--json", "acquire", "K", "-t", "5s", "-w", "0s"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ttl_ms"], 5_000, "{v}");
}

#[test]
fn log_lines_carry_utc_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let out = fencelock(&db, &["acquire", "K"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.is_empty(), "no log lines at debug level");
    for line in err.lines() {
        let stamp = line.split(' ').next().unwrap_or("");
        let parsed = chrono::DateTime::parse_from_rfc3339(stamp);
        assert!(
            parsed.is_ok_and(|t| t.offset().local_minus_utc() == 0) && stamp.ends_with('Z'),
            "{line}"
        );
    }
}

#[test]
fn a_missing_command_is_127_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let out = run(&db, &["run", "K", "--", "/no/such/command"]);
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert_eq!(code(&run(&db, &["inspect", "K"])), 1);
}

/// `list`, `inspect`, `stats` and `leader` only read: a store that is not
/// there is exit 69, and neither its directories nor the file nor the
/// tables come into being.
#[test]
fn read_only_commands_create_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir
        .path()
        .join("nonexistent-root-dir")
        .join("x")
        .join("locks.db");
    let reads: &[&[&str]] = &[&["list"], &["inspect", "k"], &["stats"], &["leader", "e"]];
    for args in reads {
        let out = run(&missing, args);
        assert_eq!(code(&out), 69, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no lock database at"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            !dir.path().join("nonexistent-root-dir").exists(),
            "{args:?} created the directory"
        );
    }
    // A file that is not a lock store (yet) is not made one by a read.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    for args in reads {
        let out = run(&empty, args);
        assert_eq!(code(&out), 69, "{args:?}: {}", stderr(&out));
        assert_eq!(
            std::fs::metadata(&empty).unwrap().len(),
            0,
            "{args:?} wrote"
        );
    }
    // Once a command that takes a lock made the store, reads work as before.
    let db = dir.path().join("locks.db");
    assert_eq!(code(&run(&db, &["acquire", "k", "--ttl", "30s"])), 0);
    for args in reads {
        let out = run(&db, args);
        assert!(matches!(code(&out), 0 | 1), "{args:?}: {}", stderr(&out));
    }
}

/// With `--json`, every failure is one JSON object on stdout with `error`
/// and the REST API's `code`.
#[test]
fn json_failures_print_error_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    // The lease outlasts the failures below that find it held.
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let taken = run(
        &db,
        &["--json", "acquire", "k", "--ttl", &ttl, "--owner", "a"],
    );
    assert_eq!(code(&taken), 0, "{}", stderr(&taken));
    let failure = |args: &[&str]| -> (i32, serde_json::Value) {
        let out = run(&db, args);
        let text = stdout(&out);
        assert_eq!(
            text.lines().count(),
            1,
            "{args:?}: {text:?} {}",
            stderr(&out)
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            value["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{args:?}: {value}"
        );
        (code(&out), value)
    };
    let (exit, held) = failure(&["--json", "acquire", "k"]);
    assert_eq!(
        (exit, held["code"].as_str()),
        (75, Some("held")),
        "{held} [{p}]"
    );
    assert_eq!(held["holder"]["owner"], "a", "{held}");
    let (exit, gone) = failure(&["--json", "release", "k", "--owner", "b", "--token", "1"]);
    assert_eq!(
        (exit, gone["code"].as_str()),
        (1, Some("not_held")),
        "{gone}"
    );
    let (exit, bad) = failure(&["--json", "acquire", ""]);
    assert_eq!(
        (exit, bad["code"].as_str()),
        (2, Some("invalid_key")),
        "{bad}"
    );
    let (exit, bad) = failure(&["--json", "--url", "nope", "list"]);
    assert_eq!(
        (exit, bad["code"].as_str()),
        (2, Some("bad_request")),
        "{bad}"
    );
    let (exit, bad) = failure(&["--json", "acquire", "k", "--frobnicate"]);
    assert_eq!(
        (exit, bad["code"].as_str()),
        (2, Some("bad_request")),
        "{bad}"
    );
    let missing = format!("sqlite://{}/none/locks.db", dir.path().display());
    let (exit, none) = failure(&["--json", "--url", &missing, "list"]);
    assert_eq!(
        (exit, none["code"].as_str()),
        (69, Some("internal")),
        "{none}"
    );
    // Nothing listens on a port just freed: refused, a transient failure.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = format!("redis://127.0.0.1:{port}");
    let (exit, down) = failure(&["--json", "--url", &refused, "acquire", "k"]);
    assert_eq!(
        (exit, down["code"].as_str()),
        (69, Some("unavailable")),
        "{down}"
    );
}

#[test]
fn completions_and_man_page() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&db, &["completions", shell]);
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(
            script.contains("fencelock") && script.contains("force-release"),
            "{shell}: {script}"
        );
    }
    let page = run(&db, &["man"]);
    assert_eq!(code(&page), 0, "{}", stderr(&page));
    assert!(
        stdout(&page).contains(".TH fencelock 1"),
        "{}",
        stdout(&page)
    );
    let page = run(&db, &["man", "acquire"]);
    assert_eq!(code(&page), 0, "{}", stderr(&page));
    assert!(
        stdout(&page).contains(".TH fencelock-acquire 1"),
        "{}",
        stdout(&page)
    );
    assert_eq!(code(&run(&db, &["man", "nope"])), 2);
    assert_eq!(code(&run(&db, &["completions", "nosh"])), 2);
    // Neither touched the store.
    assert!(!db.exists());
}

/// `acquire` never renews; its help must not say the TTL is renewed.
#[test]
fn acquire_help_does_not_promise_renewal() {
    let dir = tempfile::tempdir().unwrap();
    let help = stdout(&run(&dir.path().join("l.db"), &["acquire", "--help"]));
    let ttl = help
        .split("--ttl")
        .nth(1)
        .and_then(|rest| rest.split("\n  -").next())
        .unwrap_or_default()
        .to_owned();
    assert!(ttl.contains("never renews"), "{ttl}");
}

/// `sqlite:relative.db` (no `//`) is refused with the two ways to write it.
#[test]
fn a_sqlite_url_without_slashes_says_how_to_write_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &dir.path().join("l.db"),
        &["--url", "sqlite:relative.db", "acquire", "k"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("sqlite://relative.db") && err.contains("sqlite:///relative.db"),
        "{err}"
    );
    assert!(!err.contains("has no scheme"), "{err}");
    assert!(!dir.path().join("relative.db").exists());
}
