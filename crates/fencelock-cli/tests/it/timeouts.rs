//! A server that accepts connections and never answers must not hang the
//! CLI: every engine gives up within `--wait` plus its default connect or
//! operation timeout, with exit 69 and a one-line reason. And `--wait`
//! covers reaching the backend: refused connections are retried until it
//! ends; with `--wait 0s` a refused connection is an answer, at once.
//!
//! Time: real processes against real (silent, refusing or proxied)
//! servers. The figures under test are the CLI's own (`--wait` and its
//! engines' default timeouts) and stay as they are; what each test allows
//! beyond them for process start-up and scheduling is scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first (bases
//! [`SLACK`] and [`REFUSED_BOUND`]), and so is a `--wait` that must outlast
//! an outage; a failure names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fencelock_testkit::{
    proxy::ProxiedUrl, servers::postgres::PostgresServer, silent::SilentServer,
};

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// The `--wait` every command is given.
const WAIT: Duration = Duration::from_secs(1);
/// The longest default connect or operation timeout an engine may have: a
/// few seconds, as `docs/backends.md` documents for each.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The base of what process start-up and scheduling may add.
const SLACK: Duration = Duration::from_secs(10);

struct Running {
    what: String,
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        // A hung CLI must not outlive the test.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_silent_server_ends_every_engine_with_exit_69() {
    let silent = SilentServer::start().unwrap();
    let port = silent.port();
    let urls = [
        format!("postgres://u@127.0.0.1:{port}/db"),
        format!("mysql://u@127.0.0.1:{port}/db"),
        format!("redis://127.0.0.1:{port}"),
        format!("etcd://127.0.0.1:{port}"),
        format!("zk://127.0.0.1:{port}"),
    ];
    let wait = format!("{}s", WAIT.as_secs());
    let p = patience();
    let started = Instant::now();
    // All at once, so the test takes one bound, not ten.
    let mut running: Vec<Running> = urls
        .iter()
        .flat_map(|url| {
            [
                vec!["acquire", "k", "--wait", wait.as_str()],
                vec!["run", "k", "--wait", wait.as_str(), "--", "true"],
            ]
            .map(|args| Running {
                what: format!("{url} {args:?}"),
                child: Command::new(BIN)
                    .env("FENCELOCK_URL", url)
                    .env_remove("RUST_LOG")
                    .args(&args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            })
        })
        .collect();
    let bound = WAIT + DEFAULT_TIMEOUT + p.bound(SLACK);
    let mut failures = Vec::new();
    while !running.is_empty() {
        let mut still = Vec::new();
        for mut r in running {
            match r.child.try_wait().unwrap() {
                None if started.elapsed() < bound => still.push(r),
                None => failures.push(format!("{}: still running after {bound:?} [{p}]", r.what)),
                Some(status) => {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = r.child.stderr.take() {
                        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
                    }
                    let lines: Vec<&str> = stderr.lines().collect();
                    if status.code() != Some(69)
                        || lines.len() != 1
                        || !lines[0].starts_with("fencelock: ")
                    {
                        failures.push(format!("{}: {status}, stderr {stderr:?}", r.what));
                    }
                }
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn refused_connections_are_retried_until_the_wait_ends() {
    let server = PostgresServer::start().unwrap();
    let p = patience();
    // Outlasts the outage and the grant after it.
    let wait = ms(p.bound(Duration::from_secs(60)));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxied = runtime
        .block_on(ProxiedUrl::start(&server.url("postgres")))
        .unwrap();
    proxied.set_refuse(true);
    let child = Command::new(BIN)
        .env("FENCELOCK_URL", proxied.url())
        .env_remove("RUST_LOG")
        .args(["acquire", "k", "--wait", &wait])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Running {
        what: "acquire through a refusing proxy".into(),
        child,
    };
    // An outage well inside --wait: the CLI must outlast it, not exit 69 at
    // the first refusal. (The sleep is the outage's length, not a wait for
    // anything.)
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.child.try_wait().unwrap().is_none(),
        "{} gave up during the outage [{p}]",
        child.what
    );
    proxied.set_refuse(false);
    let started = Instant::now();
    let slack = p.bound(SLACK);
    let status = loop {
        if let Some(status) = child.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < slack,
            "no answer within {slack:?} after the outage [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
    }
    assert_eq!(status.code(), Some(0), "{stderr} [{p}]");
}

/// The base of the most a refused connection may take to end a command
/// with `--wait 0s`. It takes about 20 ms on loopback (docs/backends.md);
/// it used to take 3.7 to 5 s (the drivers' connect retries). The slack is
/// for process start-up, not for any retry; scaled by the budget.
const REFUSED_BOUND: Duration = Duration::from_secs(2);

#[test]
fn a_refused_connection_with_wait_0s_ends_at_once_on_every_engine() {
    // A port just freed: nothing listens on it, so connecting is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let urls = [
        format!("postgres://u@127.0.0.1:{port}/db"),
        format!("mysql://u@127.0.0.1:{port}/db"),
        format!("redis://127.0.0.1:{port}"),
        format!("etcd://127.0.0.1:{port}"),
        format!("zk://127.0.0.1:{port}"),
    ];
    let p = patience();
    let bound = p.bound(REFUSED_BOUND);
    let mut failures = Vec::new();
    // One at a time, so that each measures its own engine.
    for url in &urls {
        let started = Instant::now();
        let out = Command::new(BIN)
            .env("FENCELOCK_URL", url)
            .env_remove("RUST_LOG")
            .args(["acquire", "k", "--wait", "0s"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(69) || took > bound {
            failures.push(format!(
                "{url}: exit {:?} after {took:?} (bound {bound:?}) [{p}]: {stderr}",
                out.status
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
