//! `fencelock elect` and `fencelock leader`, run as separate processes
//! against one SQLite file (docs/election.md), and a takeover on Redis (a
//! backend whose observation is polled and whose waiters are woken).
//!
//! Time: real processes. Each test measures a [`Patience`] first and
//! scales from it every `--ttl` a leader must keep through the test, every
//! `--wait` a standby must outlast, and its bounds (base [`BOUND`]); a
//! failure names the budget. A `--wait` that must run out (`200ms` while
//! a leader leads) keeps its figure. The watcher needs no head start: it
//! reports the leader it finds first, so a leader elected before its
//! first read is still seen elected.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use fencelock_testkit::Patience;

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// The base of every bound: far longer than any step needs on a quiet
/// machine; a bound, not a measurement.
const BOUND: Duration = Duration::from_secs(30);

fn sqlite(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

fn fencelock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", url)
        .env_remove("RUST_LOG")
        .args(args);
    cmd
}

fn run(db: &str, args: &[&str]) -> Output {
    fencelock(db, args).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn spawn(db: &str, args: &[&str]) -> Child {
    fencelock(db, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `path` to exist (written by a command under test), for at
/// most `p.bound(BOUND)`.
fn wait_for_file(path: &Path, p: &Patience) -> String {
    let deadline = Instant::now() + p.bound(BOUND);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text.trim().to_owned();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never written [{p}]",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command that writes its term to `term` and runs until `stop` exists.
fn lead_until(term: &Path, stop: &Path) -> String {
    format!(
        "echo \"$FENCELOCK_TOKEN\" > {}.tmp && mv {0}.tmp {0}; \
         while [ ! -e {} ]; do sleep 0.02; done",
        term.display(),
        stop.display()
    )
}

/// The output of `child` once it ended, which it must within
/// `p.bound(BOUND)`.
fn wait_exit(child: Child, p: &Patience) -> Output {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    rx.recv_timeout(p.bound(BOUND))
        .unwrap_or_else(|e| panic!("the process did not end ({e}) [{p}]"))
}

#[test]
fn elect_runs_the_command_as_leader_and_exits_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite(dir.path());
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(5)));
    let out = run(
        &db,
        &[
            "elect",
            "jobs",
            "--ttl",
            &ttl,
            "--",
            "sh",
            "-c",
            "echo \"$FENCELOCK_KEY $FENCELOCK_TOKEN\"; exit 7",
        ],
    );
    assert_eq!(
        code(&out),
        7,
        "{} [{p}]",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let (key, term) = line.trim().split_once(' ').unwrap();
    assert_eq!(key, "fencelock/election/jobs");
    assert!(term.parse::<u64>().unwrap() > 0);
    // Resigned when the command ended.
    let leader = run(&db, &["leader", "jobs"]);
    assert_eq!(
        code(&leader),
        1,
        "{}",
        String::from_utf8_lossy(&leader.stdout)
    );
}

#[test]
fn standby_leads_after_the_leader_ends_and_leader_reports_both() {
    let dir = tempfile::tempdir().unwrap();
    standby_leads_after_the_leader_ends(&sqlite(dir.path()), dir.path());
}

#[test]
fn redis_standby_leads_after_the_leader_ends() {
    let server = fencelock_testkit::servers::redis::RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    standby_leads_after_the_leader_ends(&server.url(), dir.path());
}

fn standby_leads_after_the_leader_ends(db: &str, dir: &Path) {
    let p = patience();
    let db = db.to_owned();
    // Leads until told to stop, renewed in time all along.
    let ttl = ms(p.ttl(Duration::from_secs(30)));
    let (term_a, stop) = (dir.join("a.term"), dir.join("stop"));
    let a = spawn(
        &db,
        &[
            "elect",
            "svc",
            "--owner",
            "node-a",
            "--value",
            "10.0.0.1:80",
            "--ttl",
            &ttl,
            "--",
            "sh",
            "-c",
            &lead_until(&term_a, &stop),
        ],
    );
    let first: u64 = wait_for_file(&term_a, &p).parse().unwrap();
    let shown = run(&db, &["leader", "svc", "--json"]);
    assert_eq!(code(&shown), 0);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["owner"], "node-a");
    assert_eq!(shown["term"], first);
    assert_eq!(shown["value"], "10.0.0.1:80");
    assert!(shown["expires_in_ms"].as_u64().unwrap() > 0, "{shown}");

    let busy = run(&db, &["elect", "svc", "--wait", "200ms", "--", "true"]);
    assert_eq!(
        code(&busy),
        75,
        "{} [{p}]",
        String::from_utf8_lossy(&busy.stderr)
    );
    let standby_wait = ms(p.bound(Duration::from_secs(60)));

    let b = spawn(
        &db,
        &[
            "elect",
            "svc",
            "--owner",
            "node-b",
            "--wait",
            &standby_wait,
            "--",
            "sh",
            "-c",
            "echo \"$FENCELOCK_TOKEN\"",
        ],
    );
    std::fs::write(&stop, "").unwrap();
    let a = wait_exit(a, &p);
    assert_eq!(code(&a), 0, "{} [{p}]", String::from_utf8_lossy(&a.stderr));
    let b = wait_exit(b, &p);
    assert_eq!(code(&b), 0, "{} [{p}]", String::from_utf8_lossy(&b.stderr));
    let second: u64 = String::from_utf8_lossy(&b.stdout).trim().parse().unwrap();
    assert!(second > first, "term {second} after term {first}");
}

#[test]
fn a_deposed_leaders_command_is_stopped_with_76() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite(dir.path());
    let (term, stop) = (dir.path().join("term"), dir.path().join("never"));
    // Still leading when forced out: the loss is the force-release's.
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(1)));
    let leader = spawn(
        &db,
        &[
            "elect",
            "deposed",
            "--ttl",
            &ttl,
            "--",
            "sh",
            "-c",
            &lead_until(&term, &stop),
        ],
    );
    wait_for_file(&term, &p);
    let forced = run(&db, &["force-release", "fencelock/election/deposed"]);
    assert_eq!(
        code(&forced),
        0,
        "{} [{p}]",
        String::from_utf8_lossy(&forced.stderr)
    );
    let out = wait_exit(leader, &p);
    assert_eq!(
        code(&out),
        76,
        "{} [{p}]",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn leader_watch_prints_each_election_and_vacancy() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite(dir.path());
    let p = patience();
    // The store first (`leader` only reads, and creates nothing).
    assert_eq!(code(&run(&db, &["cleanup"])), 0);
    let mut watch = spawn(&db, &["leader", "w", "--watch", "--json"]);
    let (tx, lines) = mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    // Read as it comes, so that the watcher never blocks on a full pipe,
    // and shown if a change does not come.
    let logged = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = watch.stderr.take().unwrap();
    let log = std::sync::Arc::clone(&logged);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = log.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let next = |what: &str| -> serde_json::Value {
        match lines.recv_timeout(p.bound(BOUND)) {
            Ok(line) => serde_json::from_str(&line).unwrap(),
            Err(e) => panic!(
                "no {what} printed ({e}) [{p}]; the watcher's log:\n{}",
                logged.lock().unwrap()
            ),
        }
    };
    let (term, go) = (dir.path().join("term"), dir.path().join("go"));
    // A lease well inside the bound (both scaled alike): should the
    // leader's release fail on a loaded machine (it then exits with its
    // command's code all the same, and says so on stderr), the vacancy
    // still comes, by expiry.
    let ttl = ms(p.ttl(Duration::from_secs(10)));
    let leader = spawn(
        &db,
        &[
            "elect",
            "w",
            "--owner",
            "watched",
            "--ttl",
            &ttl,
            "--",
            "sh",
            "-c",
            &lead_until(&term, &go),
        ],
    );
    let t: u64 = wait_for_file(&term, &p).parse().unwrap();
    let elected = next("election");
    assert_eq!(elected["event"], "elected", "{elected}");
    assert_eq!(elected["owner"], "watched");
    assert_eq!(elected["term"], t);
    // The leader steps down only once its election was seen.
    std::fs::write(&go, "").unwrap();
    let stepped_down = wait_exit(leader, &p);
    let stderr = String::from_utf8_lossy(&stepped_down.stderr);
    assert_eq!(code(&stepped_down), 0, "{stderr} [{p}]");
    let released = !stderr.contains("could not release");
    let vacant = next("vacancy");
    assert_eq!(vacant["event"], "vacant", "{vacant}");
    assert_eq!(vacant["previous_term"], t);
    // A release the leader saw through ends the term before its lease
    // could: a resignation. One it gave up on may still have reached the
    // store after its deadline, so then either way is the truth.
    if released {
        assert_eq!(vacant["expired"], false, "{vacant} {stderr} [{p}]");
    } else {
        assert!(vacant["expired"].is_boolean(), "{vacant} {stderr}");
    }
    watch.kill().unwrap();
    let _ = watch.wait();
}
