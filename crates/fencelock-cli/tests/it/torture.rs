//! `fencelock torture` on every backend, each on a throwaway server the
//! harness starts from the binaries on PATH (a missing one fails the test):
//! a short run with every fault that applies must end with zero violations
//! and must actually have injected faults; the same on SQLite without the
//! fence must lose updates. Those two SQLite runs also export their
//! history to the outside checker (Porcupine), which must agree with ours
//! and find the unfenced run's violations too.
//!
//! The seeds are chosen so that the first faults of each schedule include
//! the kinds asserted below; a seed fixes the order of the faults, and each
//! run lasts long enough for several of them whatever the machine's speed.
//!
//! The other workloads (semaphore, rwlock, election, multi) run briefly on
//! each of those backends, one server shared by the four runs where the
//! server is slow to start: zero violations, faults injected, writes
//! admitted, and the shape each workload must show (permits used at once,
//! readers admitted, several terms, several keys).
//!
//! Time: real servers and processes. The nemesis spaces its faults in
//! leases, and what a run must show (faults injected, writes admitted, the
//! workload's shape) needs the run to last several of them and each
//! recovery to fit, so each test measures a [`Patience`] first and scales
//! from it both the workers' `--ttl` (base [`TTL`]) and the run's
//! `--duration` (the base each test names) by the same factor: a busy
//! machine gets longer leases and as many faults in a longer run. A
//! failure names the budget. Zero violations is no matter of time.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{process::Command, time::Duration};

use crate::support::{self, ms, patience};

use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster, mariadb::MariaDbServer, postgres::PostgresServer, zookeeper::ZkServer,
    },
    Patience,
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// The base of the workers' lease: short, so that faults (spaced in
/// leases) come often.
const TTL: Duration = Duration::from_secs(1);

/// A run's time: its base duration in seconds, scaled with the lease by
/// the budget measured when it was made.
#[derive(Clone, Copy)]
struct Run {
    secs: u64,
    patience: Patience,
}

impl Run {
    /// A run of `secs` seconds on a quiet machine.
    fn of(secs: u64) -> Self {
        Self {
            secs,
            patience: patience(),
        }
    }

    /// `--duration D --ttl T`, scaled.
    fn args(&self) -> [String; 4] {
        let p = &self.patience;
        [
            "--duration".into(),
            ms(p.bound(Duration::from_secs(self.secs))),
            "--ttl".into(),
            ms(p.ttl(TTL)),
        ]
    }
}

/// Runs `fencelock torture ARGS --report FILE` for `run`; the exit code
/// and report.
fn torture(run: Run, args: &[&str]) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    torture_in(dir.path(), run, args)
}

/// Runs `fencelock torture ARGS --history FILE` and has the outside
/// checker (Porcupine, `crates/fencelock-lab/porcupine`, run with `go` from
/// PATH; a missing Go fails the test) check that history: it must agree
/// with our checker and, with `expect_violations`, find violations.
fn torture_checked_outside(run: Run, args: &[&str], expect_violations: bool) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.json");
    let mut args = args.to_vec();
    args.extend(["--history", history.to_str().unwrap()]);
    let result = torture_in(dir.path(), run, &args);
    let checker = concat!(env!("CARGO_MANIFEST_DIR"), "/../fencelock-lab/porcupine");
    let out = Command::new("go")
        .current_dir(checker)
        .arg("run")
        .arg(".")
        .args(expect_violations.then_some("-expect-violations"))
        .arg(&history)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run go (Go >= 1.21 on PATH runs the outside checker): {e}")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("outside checker: {said}");
    assert!(
        out.status.success(),
        "the outside checker disagrees: {said}"
    );
    let exported: Value =
        serde_json::from_str(&std::fs::read_to_string(&history).unwrap()).unwrap();
    assert!(
        exported["holds"].as_array().is_some_and(|h| !h.is_empty()),
        "no trusted interval exported"
    );
    result
}

fn torture_in(dir: &std::path::Path, run: Run, args: &[&str]) -> (i32, Value) {
    let report = dir.join("report.json");
    let out = Command::new(BIN)
        .env_remove("FENCELOCK_URL")
        .env_remove("RUST_LOG")
        .arg("torture")
        .args(args)
        .args(run.args())
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().expect("exited normally");
    let p = run.patience;
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}); exit {code} [{p}]\n{stdout}\n{stderr}"));
    // Shown when an assertion below fails.
    eprintln!("{stdout}\n{stderr}\n[{p}]");
    (code, serde_json::from_str(&text).unwrap())
}

fn count(report: &Value, path: &[&str]) -> u64 {
    path.iter().fold(report, |v, k| &v[k]).as_u64().unwrap_or(0)
}

fn faults(report: &Value, kind: &str) -> u64 {
    count(report, &["results", "faults", kind])
}

/// Zero violations, faults injected, writes admitted.
fn assert_survived(code: i32, report: &Value) {
    assert_eq!(report["violations"], 0, "{report:#}");
    assert_eq!(code, 0);
    let injected: u64 = report["results"]["faults"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(injected > 0, "no fault was injected");
    assert!(count(report, &["results", "writes_admitted"]) > 0);
}

/// A paused worker between its read and its write (the nemesis waits for
/// one) stays stopped for at least 1.5 leases, so its lease ends and
/// another worker is admitted with a newer token before it resumes: its
/// write must be refused, and is counted.
#[test]
fn sqlite_pauses() {
    let (code, report) =
        torture_checked_outside(Run::of(45), &["--server", "sqlite", "--seed", "1"], false);
    assert_survived(code, &report);
    assert!(faults(&report, "pause") > 0);
    assert!(
        count(&report, &["results", "writes_refused"]) > 0,
        "no stale write reached the fence: the pauses did not bite"
    );
    no_two_holders(&report);
}

/// SQLite keeps its leases through every pause, so a paused holder's
/// trust ends at its deadline, before its lease and so before the next
/// grant (I1 with I5): no two trusted intervals overlap, though beliefs do.
fn no_two_holders(report: &Value) {
    assert_eq!(
        count(report, &["results", "trusted_overlaps"]),
        0,
        "{report:#}"
    );
}

/// Without the fence the same pauses lose updates. Not a matter of luck:
/// the victim of each pause has read the counter and not yet written it; it
/// is stopped for at least 1.5 leases, and within one lease of the pause
/// another worker takes the lock and reads the same value, so whichever of
/// the two writes second overwrites the other's increment. Thirty seconds
/// hold several such pauses; one suffices.
#[test]
fn sqlite_unfenced_pauses_lose_updates() {
    let (code, report) = torture_checked_outside(
        Run::of(30),
        &[
            "--server",
            "sqlite",
            "--unfenced",
            "--faults",
            "pause",
            "--seed",
            "1",
        ],
        true,
    );
    assert!(faults(&report, "pause") > 0, "{report:#}");
    assert!(
        count(&report, &["results", "lost_updates", "count"]) > 0,
        "{report:#}"
    );
    no_two_holders(&report);
    assert_eq!(code, 3, "violations exit 3");
}

/// Seed 2 draws pause, partition, partition, restart, latency, reset.
fn server(kind: &str) {
    let (code, report) = torture(Run::of(45), &["--server", kind, "--seed", "2"]);
    assert_survived(code, &report);
    for kind in ["pause", "partition", "restart"] {
        assert!(faults(&report, kind) > 0, "no {kind} fault");
    }
}

/// Three `fencelock serve` replicas behind HAProxy; `restart` kills -9 a
/// replica under the workers.
#[test]
fn service_replicas_behind_haproxy_all_faults() {
    server("replicas");
}

#[test]
fn postgres_all_faults() {
    server("postgres");
}

#[test]
fn mariadb_all_faults() {
    server("mariadb");
}

#[test]
fn redis_all_faults() {
    server("redis");
}

/// Redlock's own faults: `restart` kills -9 one node and starts it again
/// empty, `leader` pauses the first node (every race's arbiter). Seed 42
/// with these four kinds draws restart, leader, restart, pause, leader,
/// partition, …
#[test]
fn redlock_node_kills_restarts_and_pauses() {
    let (code, report) = torture(
        Run::of(60),
        &[
            "--server",
            "redlock",
            "--faults",
            "restart,leader,partition,pause",
            "--seed",
            "42",
        ],
    );
    assert_survived(code, &report);
    for kind in ["restart", "leader", "pause"] {
        assert!(faults(&report, kind) > 0, "no {kind} fault");
    }
}

/// Seed 28 draws pause, leader, partition, restart, … Leases on etcd last
/// at least 2 s, so faults come half as often as above.
#[test]
fn etcd_cluster_all_faults_with_leader_kills() {
    let (code, report) = torture(Run::of(60), &["--server", "etcd-cluster", "--seed", "28"]);
    assert_survived(code, &report);
    for kind in ["pause", "leader"] {
        assert!(faults(&report, kind) > 0, "no {kind} fault");
    }
}

/// The Sentinel master killed (`leader`: the Sentinels fail over to the
/// replica, the killed node comes back as its replica), with pauses and
/// whole-set crashes: zero violations, the workers following the master
/// through every failover.
#[test]
fn redis_sentinel_master_failovers() {
    let (code, report) = torture(
        Run::of(60),
        &[
            "--server",
            "redis-sentinel",
            "--faults",
            "leader,pause,restart",
            "--seed",
            "7",
        ],
    );
    assert_survived(code, &report);
    assert!(faults(&report, "leader") > 0, "no failover");
}

/// The control: the same failovers and pauses without the fence show two
/// workers believing they hold the lock at once.
#[test]
fn redis_sentinel_unfenced_failovers_overlap() {
    let (_, report) = torture(
        Run::of(45),
        &[
            "--server",
            "redis-sentinel",
            "--unfenced",
            "--faults",
            "leader,pause",
            "--seed",
            "7",
        ],
    );
    assert!(faults(&report, "leader") > 0, "no failover: {report:#}");
    assert!(
        count(&report, &["results", "overlaps"]) > 0
            || count(&report, &["results", "lost_updates", "count"]) > 0,
        "{report:#}"
    );
}

/// Faults the harness cannot inject are refused before anything starts.
#[test]
fn inapplicable_faults_are_usage_errors() {
    for (args, why) in [
        (
            &["--url", "redis://127.0.0.1:1/0", "--faults", "restart"][..],
            "only servers it started",
        ),
        (
            &["--server", "redis", "--faults", "leader"][..],
            "etcd-cluster",
        ),
        (
            &["--server", "sqlite", "--faults", "partition"][..],
            "SQLite",
        ),
        (&["--url", "mem://"][..], "mem://"),
        (
            &["--server", "sqlite", "--faults", "reshard"][..],
            "--server sharded",
        ),
        (
            &[
                "--server",
                "sqlite",
                "--workload",
                "semaphore",
                "--permits",
                "4",
            ][..],
            "fewer permits than --workers",
        ),
        (&[][..], "--url URL or --server"),
    ] {
        let out = Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .arg("torture")
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}

/// The key moves between shards while the workers run: the nemesis steps
/// the map through a move and back, one transition step at a time. Without
/// the fence, any moment with two holders would lose an update or regress a
/// token; jumping from the old map to the new one (skipping the two
/// transition steps) does, in the same run (tried while writing this).
/// Each reshard waits for every worker to reopen on the step, so 25 s hold
/// at least three: the key has then moved to the new shard.
#[test]
fn sharded_reshards_keep_exclusion_without_the_fence() {
    let (code, report) = torture(
        Run::of(25),
        &[
            "--server",
            "sharded",
            "--faults",
            "reshard",
            "--unfenced",
            "--seed",
            "8",
        ],
    );
    assert_survived(code, &report);
    assert!(faults(&report, "reshard") >= 3, "{report:#}");
}

/// Through the lock service: the workers reach `fencelock serve` over
/// HTTP, through proxies that cut, delay and reset their connections.
/// Seed 2 draws pause and partition among the first faults.
#[test]
fn http_service_all_faults() {
    let service = support::LockService::start(&[]);
    let (code, report) = torture(Run::of(30), &["--url", &service.url, "--seed", "2"]);
    assert_survived(code, &report);
    for kind in ["pause", "partition"] {
        assert!(faults(&report, kind) > 0, "no {kind} fault");
    }
}

/// The workloads other than `lock`, with what each must show besides zero
/// violations.
const WORKLOADS: [&str; 4] = ["semaphore", "rwlock", "election", "multi"];

/// Runs each workload for `secs` seconds (scaled) against `target`
/// (`--server KIND` or `--url URL`) with `faults` (empty: every fault that
/// applies).
fn workloads(target: &[&str], faults: &str, secs: u64) {
    workloads_of(&WORKLOADS, target, faults, secs);
}

fn workloads_of(list: &[&str], target: &[&str], faults: &str, secs: u64) {
    for &workload in list {
        let mut args = target.to_vec();
        args.extend(["--workload", workload, "--permits", "2", "--seed", "2"]);
        if !faults.is_empty() {
            args.extend(["--faults", faults]);
        }
        let (code, report) = torture(Run::of(secs), &args);
        assert_survived(code, &report);
        assert_eq!(report["config"]["workload"], workload, "{report:#}");
        let results = &report["results"];
        let shape = match workload {
            // Two permits in use at once (and, with no violation, never
            // three) on two slots' counters.
            "semaphore" => {
                count(results, &["max_concurrent_writers"]) == 2
                    && results["counters"].as_object().unwrap().len() == 2
            }
            "rwlock" => {
                count(results, &["reader_writes_admitted"]) > 0
                    && count(results, &["writes_admitted"])
                        > count(results, &["reader_writes_admitted"])
            }
            "election" => count(results, &["distinct_tokens"]) > 1,
            _ => results["counters"].as_object().unwrap().len() > 1,
        };
        assert!(shape, "{workload}: not the expected shape: {report:#}");
    }
}

#[test]
fn workloads_on_sqlite() {
    workloads(&["--server", "sqlite"], "", 7);
}

/// Redis starts in milliseconds: a throwaway server per run, so that
/// restarts are among the faults (seed 2 draws pause and partition first).
#[test]
fn workloads_on_redis() {
    workloads(&["--server", "redis"], "", 7);
}

#[test]
fn workloads_on_postgres() {
    let server = PostgresServer::start().unwrap();
    workloads(&["--url", &server.url("postgres")], "pause,partition", 7);
}

#[test]
fn workloads_on_mariadb() {
    let server = MariaDbServer::start().unwrap();
    workloads(&["--url", &server.url("mysql")], "pause,partition", 7);
}

/// One member; leases on etcd last at least 2 s, so the runs are longer.
#[test]
fn workloads_on_etcd() {
    let server = EtcdCluster::start().unwrap();
    workloads(&["--url", &server.url()], "pause,partition", 11);
}

/// One standalone server shared by the runs (a JVM starts in seconds).
#[test]
fn workloads_on_zookeeper() {
    let server = ZkServer::start().unwrap();
    workloads(&["--url", &server.url()], "pause,partition", 7);
}

/// Every workload through the service, read-write locks included (its
/// SQLite backend offers them, and the `http://` backend passes them on).
#[test]
fn workloads_on_the_http_service() {
    let service = support::LockService::start(&[]);
    let target = ["--url", service.url.as_str()];
    workloads_of(
        &["semaphore", "election", "multi", "rwlock"],
        &target,
        "pause,partition",
        7,
    );
}

/// Without the fence, pauses of permit holders between their read and
/// their write break the semaphore's guarantees at the resource: the
/// checker must say so.
#[test]
fn sqlite_unfenced_semaphore_is_caught() {
    let (code, report) = torture(
        Run::of(10),
        &[
            "--server",
            "sqlite",
            "--workload",
            "semaphore",
            "--permits",
            "2",
            "--unfenced",
            "--seed",
            "1",
        ],
    );
    assert!(count(&report, &["violations"]) > 0, "{report:#}");
    assert_eq!(code, 3, "violations exit 3");
}
