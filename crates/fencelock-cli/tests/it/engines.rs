//! The `fencelock` binary against every server engine, each a throwaway
//! server the test kit starts: racing processes on an expired key, and
//! tokens across release, expiry and cleanup.
//!
//! Time: real processes and servers. Each engine's run measures a
//! [`Patience`] first and scales from it the racers' lease (base 30 s: the
//! winner's must outlast the 49 others' start), the bound of each wait for
//! a lease to run out (20 s), and the Curator layout's session timeout
//! (4 s, in whole even seconds) with the job that must outlast its grant;
//! a failure names the budget. A lease meant to run out (300 ms) keeps its
//! figure, and so does the one-shot default TTL a release or cleanup right
//! after needs.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster, mariadb::MariaDbServer, postgres::PostgresServer, redis::RedisServer,
        zookeeper::ZkServer,
    },
    Patience,
};

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

fn fencelock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", url)
        .env_remove("RUST_LOG")
        .args(args);
    cmd
}

fn run(url: &str, args: &[&str]) -> Output {
    fencelock(url, args).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

/// The `token=` field of `acquire`'s line (`acquired KEY token=T owner=O …`).
fn token(out: &Output) -> u64 {
    assert_eq!(code(out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    let token = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("token="));
    token
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

fn wait_until_free(url: &str, key: &str, p: &Patience) {
    let deadline = Instant::now() + p.bound(Duration::from_secs(20));
    while code(&run(url, &["inspect", key])) == 0 {
        assert!(Instant::now() < deadline, "{key} never expired [{p}]");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs 50 `fencelock acquire KEY` processes at once; returns their outputs.
fn race(url: &str, key: &str, p: &Patience) -> Vec<Output> {
    let ttl = ms(p.ttl(Duration::from_secs(30)));
    let racers: Vec<_> = (0..50)
        .map(|_| {
            fencelock(url, &["acquire", key, "--ttl", &ttl, "--wait", "0s"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    racers
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// Exactly one of the racers exited 0 and the 49 others 75; the winner's
/// token.
fn single_winner(round: &str, outs: &[Output], p: &Patience) -> u64 {
    let codes: Vec<i32> = outs.iter().map(code).collect();
    for o in outs.iter().filter(|o| code(o) != 0 && code(o) != 75) {
        eprintln!("unexpected: {}", String::from_utf8_lossy(&o.stderr));
    }
    let winners: Vec<&Output> = outs.iter().filter(|o| code(o) == 0).collect();
    assert_eq!(winners.len(), 1, "{round}: {codes:?} [{p}]");
    assert_eq!(
        codes.iter().filter(|&&c| c == 75).count(),
        49,
        "{round}: {codes:?} [{p}]"
    );
    token(winners[0])
}

/// 50 `fencelock acquire` processes on a free key, and three times on a key
/// whose lease has expired: one exits 0, 49 exit 75, and a takeover's token
/// is higher than the expired lease's.
fn fifty_processes_on_a_free_and_an_expired_key(url: &str, p: &Patience) {
    single_winner("free key", &race(url, "race-free", p), p);
    for round in 0..3 {
        let key = format!("race-{round}");
        let expired = token(&run(url, &["acquire", &key, "--ttl", "300ms"]));
        wait_until_free(url, &key, p);
        let winner = single_winner(
            &format!("expired key, round {round}"),
            &race(url, &key, p),
            p,
        );
        assert!(winner > expired);
    }
}

/// Tokens printed by the CLI grow across release, expiry and a cleanup that
/// deleted the released and expired rows.
fn tokens_grow_across_cleanup(url: &str, p: &Patience) {
    let t1 = token(&run(url, &["acquire", "K", "--owner", "a"]));
    let released = run(
        url,
        &["release", "K", "--owner", "a", "--token", &t1.to_string()],
    );
    assert_eq!(code(&released), 0);
    let t2 = token(&run(
        url,
        &["acquire", "K", "--owner", "b", "--ttl", "300ms"],
    ));
    wait_until_free(url, "K", p);
    assert_eq!(code(&run(url, &["cleanup"])), 0);
    let stats = run(url, &["--json", "stats"]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["expired_not_cleaned"], 0, "{stats}");
    let t3 = token(&run(url, &["acquire", "K", "--owner", "c"]));
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
}

/// A TTL below fencelock's minimum is bad input on every engine; a short one
/// above it is granted, and the CLI reports the TTL the engine actually
/// granted (etcd rounds up to its own minimum). Returns that TTL.
fn short_ttls(url: &str) -> Duration {
    let out = run(url, &["acquire", "short", "--ttl", "1ms"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{err}");
    assert!(err.contains("100ms"), "{err}");
    let out = run(url, &["--json", "acquire", "short", "--ttl", "200ms"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let granted = Duration::from_millis(shown["ttl_ms"].as_u64().unwrap());
    assert!(granted >= Duration::from_millis(200), "{shown}");
    granted
}

fn exercise(url: &str) -> Duration {
    let p = patience();
    fifty_processes_on_a_free_and_an_expired_key(url, &p);
    tokens_grow_across_cleanup(url, &p);
    short_ttls(url)
}

#[test]
fn postgres() {
    let server = PostgresServer::start().unwrap();
    exercise(&format!("{}?table_prefix=cli_", server.url("postgres")));
}

#[test]
fn mariadb() {
    let server = MariaDbServer::start().unwrap();
    exercise(&format!("{}?table_prefix=cli_", server.url("mysql")));
}

#[test]
fn redis() {
    let server = RedisServer::start().unwrap();
    exercise(&server.url());
}

#[test]
fn etcd() {
    let server = EtcdCluster::start().unwrap();
    let granted = exercise(&server.url());
    assert!(
        granted > Duration::from_millis(200),
        "etcd granted {granted:?}"
    );
}

#[test]
fn zookeeper() {
    let server = ZkServer::start().unwrap();
    exercise(&server.url());
}

/// `layout=curator` leases belong to the process's ZooKeeper session: a
/// one-shot `acquire`, whose lease would go as the process exits, is
/// refused with what to use instead, and `run` with a TTL above what the
/// session allows (half of it) says what it was granted and holds the lock
/// past that grant by renewing in step.
#[test]
fn zookeeper_curator_layout_is_held_by_its_process() {
    let server = ZkServer::start().unwrap();
    let p = patience();
    // The server's tickTime is 2 s, so 4 s is the shortest session and
    // 40 s the longest; whole even seconds, so that the grant (half the
    // session) is whole seconds too, and below the 30 s asked.
    let pairs = p.bound(Duration::from_secs(4)).as_millis().div_ceil(2000);
    let session = (u64::try_from(pairs).unwrap() * 2).clamp(4, 40);
    let grant = session / 2;
    let url = format!("{}?layout=curator&session_timeout={session}s", server.url());
    let refused = run(&url, &["acquire", "one-shot", "--ttl", "30s"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 2, "{said}");
    assert!(said.contains("fencelock run"), "{said}");
    // The job outlasts two grants and a half: renewed in step, or lost.
    let job = format!("sleep {}", grant * 5 / 2);
    let held = run(
        &url,
        &["run", "held", "--ttl", "30s", "--", "sh", "-c", &job],
    );
    let said = String::from_utf8_lossy(&held.stderr);
    assert_eq!(code(&held), 0, "{said} [{p}]");
    let expected = format!("granted {grant}s for --ttl 30s (its most; renewed in step)");
    assert!(said.contains(&expected), "{said} [{p}]");
}
