//! `fencelock bench`: every scenario runs briefly and prints one well-formed
//! JSON report with sane fields, on SQLite and on the server engines (each a
//! throwaway server), with the raw baseline where it applies, and `handoff`
//! through `fencelock serve`. Never asserts a speed.
//!
//! Time: real servers and processes. What a run shows depends on what it
//! completes within its `--duration` and on its leases outliving its
//! renewals, so each test measures a [`Patience`] first and scales from it
//! every `--duration` and `--ttl` it passes (the bases are the figures
//! written beside them); a failure names the budget. The figures a run
//! measures are `fencelock bench`'s to report, never asserted.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support::{self, ms, patience};

use std::{
    process::{Command, Output},
    time::Duration,
};

use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster, mariadb::MariaDbServer, postgres::PostgresServer, redis::RedisServer,
    },
    Patience,
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

fn run(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("RUST_LOG")
        .env_remove("FENCELOCK_URL")
        .args([
            "--json", "bench", "--url", url, "--warmup", "50ms", "--rounds", "2",
        ])
        .args(args)
        .output()
        .unwrap()
}

/// `base` scaled by `p`, as a duration flag.
fn scaled(p: &Patience, base_ms: u64) -> String {
    ms(p.bound(Duration::from_millis(base_ms)))
}

/// Runs a scenario and returns its report, checked for exit 0 and one JSON
/// object on stdout.
fn bench(url: &str, args: &[&str], p: &Patience) -> Value {
    let out = run(url, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr} [{p}]");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim().lines().count(), 1, "one JSON line: {text}");
    serde_json::from_str(&text).unwrap()
}

fn f(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing in {v}"))
}

/// Counts are consistent, rates are rates, percentiles are ordered.
fn sane(figures: &Value) {
    let (ops, successes) = (f(figures, "ops"), f(figures, "successes"));
    assert!(ops > 0.0, "no operation completed: {figures}");
    assert!(successes > 0.0 && successes <= ops, "{figures}");
    assert!(f(figures, "ops_per_sec") > 0.0, "{figures}");
    assert!(f(figures, "seconds") > 0.0, "{figures}");
    let rate = f(figures, "success_rate");
    assert!((0.0..=1.0).contains(&rate), "{figures}");
    let l = &figures["latency_ms"];
    assert_eq!(f(l, "samples"), ops, "one latency per op: {figures}");
    let (p50, p99, p999, max) = (f(l, "p50"), f(l, "p99"), f(l, "p999"), f(l, "max"));
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
        "{figures}"
    );
}

fn sane_with_baseline(report: &Value) {
    sane(&report["fencelock"]);
    let baseline = &report["baseline"];
    sane(&baseline["figures"]);
    assert!(baseline["raw"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(f(baseline, "ops_ratio") > 0.0 && f(baseline, "p50_ratio") > 0.0);
}

/// `cycle`, `handoff` and `semaphore` with the raw baseline, and
/// `failover`, as on every engine.
fn on_every_engine(url: &str, backend: &str, p: &Patience) {
    let cycle = bench(
        url,
        &[
            "--scenario",
            "cycle",
            "--clients",
            "2",
            "--duration",
            &scaled(p, 400),
            "--baseline",
        ],
        p,
    );
    assert_eq!(cycle["backend"], backend);
    assert_eq!(
        cycle["fencelock"]["success_rate"], 1.0,
        "own keys: {cycle} [{p}]"
    );
    assert_eq!(cycle["fencelock"]["errors"], 0, "{cycle} [{p}]");
    sane_with_baseline(&cycle);
    let handoff = bench(
        url,
        &[
            "--scenario",
            "handoff",
            "--duration",
            &scaled(p, 600),
            "--baseline",
        ],
        p,
    );
    sane_with_baseline(&handoff);

    let semaphore = bench(
        url,
        &[
            "--scenario",
            "semaphore",
            "--permits",
            "3",
            "--duration",
            &scaled(p, 400),
            "--baseline",
        ],
        p,
    );
    assert_eq!(semaphore["permits"], 3, "{semaphore}");
    // Two clients, three permits: a permit is always free.
    assert_eq!(
        semaphore["fencelock"]["success_rate"], 1.0,
        "{semaphore} [{p}]"
    );
    sane_with_baseline(&semaphore);

    failover(url, p);
}

/// One round at least: the killed leader's lease was still on the backend
/// (SIGKILL released nothing), and the standby was elected after it. The
/// lease (base 1 s) outlasts the standby's start on a busy machine too.
fn failover(url: &str, p: &Patience) {
    let report = bench(
        url,
        &[
            "--scenario",
            "failover",
            "--ttl",
            &scaled(p, 1000),
            "--duration",
            &scaled(p, 500),
        ],
        p,
    );
    sane(&report["fencelock"]);
    assert_eq!(report["fencelock"]["errors"], 0, "{report} [{p}]");
    let f_over = &report["failover"];
    let rounds = f(f_over, "rounds");
    assert!(rounds >= 1.0, "{report} [{p}]");
    assert_eq!(f(&f_over["lease_left_ms"], "samples"), rounds, "{report}");
    assert!(f(&f_over["lease_left_ms"], "p50") > 0.0, "{report} [{p}]");
    assert_eq!(f(&f_over["after_expiry_ms"], "samples"), rounds, "{report}");
}

#[test]
fn every_scenario_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let p = patience();
    on_every_engine(&url, "sqlite", &p);

    let contended = bench(
        &url,
        &[
            "--scenario",
            "contended",
            "--clients",
            "4",
            "--duration",
            &scaled(&p, 400),
            "--baseline",
        ],
        &p,
    );
    assert_eq!(contended["clients"], 4);
    sane_with_baseline(&contended);

    // TTL 3 s (base), renewed every third of it: each lock's first
    // renewal is due within a third of the TTL of the run's start, and the
    // run lasts a TTL, so a renewal batch whose commit waits out an fsync
    // stall of up to two thirds of it (other tests' servers share the
    // disk) still counts. Both scale alike.
    let renew = bench(
        &url,
        &[
            "--scenario",
            "renew",
            "--keys",
            "20",
            "--ttl",
            &scaled(&p, 3000),
            "--duration",
            &scaled(&p, 3000),
        ],
        &p,
    );
    sane(&renew["fencelock"]);
    let r = &renew["renewals"];
    assert!(f(r, "renewed") >= 20.0, "{renew} [{p}]");
    assert_eq!(r["lost"], 0, "{renew} [{p}]");
    assert_eq!(r["still_held"], 20, "{renew} [{p}]");

    let hold = bench(
        &url,
        &[
            "--scenario",
            "hold",
            "--keys",
            "200",
            "--ttl",
            &scaled(&p, 3000),
            "--duration",
            &scaled(&p, 1000),
        ],
        &p,
    );
    sane(&hold["fencelock"]);
    let h = &hold["hold"];
    assert_eq!(h["locks"], 200, "{hold} [{p}]");
    assert!(f(h, "rss_held_bytes") > 0.0, "{hold}");
    assert!(
        f(h, "bytes_per_lock").is_finite() && f(h, "cpu_seconds") >= 0.0,
        "{hold}"
    );
    assert_eq!(hold["renewals"]["still_held"], 200, "{hold} [{p}]");
}

/// `handoff` through `fencelock serve` over SQLite: the waiter is inside
/// its long poll when the holder releases, so hand-offs are measured, and
/// none fails. What they cost is docs/benchmarks.md's, never asserted.
#[test]
fn handoff_through_the_service() {
    let p = patience();
    let service = support::LockService::start(&[]);
    let handoff = bench(
        &service.url,
        &["--scenario", "handoff", "--duration", &scaled(&p, 600)],
        &p,
    );
    assert_eq!(handoff["backend"], "http", "{handoff}");
    sane(&handoff["fencelock"]);
    assert_eq!(handoff["fencelock"]["errors"], 0, "{handoff} [{p}]");
}

#[test]
fn bad_combinations_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    for args in [
        &["--scenario", "handoff", "--clients", "1"][..],
        &["--scenario", "hold", "--baseline"],
        &["--scenario", "failover", "--baseline"],
        &["--scenario", "cycle", "--permits", "2"],
        &["--scenario", "semaphore", "--permits", "0"],
        &["--scenario", "cycle", "--keys", "0"],
        &["--scenario", "nonsense"],
    ] {
        let out = run(&url, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        // With --json, the failure is one object on stdout and no report.
        let failure: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {:?}", out.stdout));
        assert_eq!(failure["code"], "bad_request", "{args:?}: {failure}");
    }
}

#[test]
fn failover_needs_a_backend_processes_share() {
    let out = run("mem://", &["--scenario", "failover", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("processes share"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn redis() {
    let server = RedisServer::start().unwrap();
    on_every_engine(&server.url(), "redis", &patience());
}

#[test]
fn postgres() {
    let server = PostgresServer::start().unwrap();
    on_every_engine(
        &format!("{}?table_prefix=bench_", server.url("postgres")),
        "postgres",
        &patience(),
    );
}

#[test]
fn mariadb() {
    let server = MariaDbServer::start().unwrap();
    on_every_engine(
        &format!("{}?table_prefix=bench_", server.url("mysql")),
        "mysql",
        &patience(),
    );
}

#[test]
fn etcd() {
    let server = EtcdCluster::start().unwrap();
    on_every_engine(&server.url(), "etcd", &patience());
}
