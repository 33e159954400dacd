//! How many server connections `fencelock` processes use on PostgreSQL and
//! MariaDB: a one-shot command opens exactly one, and more concurrent
//! processes than the server's `max_connections` all succeed, because "too
//! many connections" is transient and retried (within `connect_timeout`
//! when connecting, within `--wait` when acquiring).
//!
//! Time: real processes and servers. How long the retries of "too many
//! connections" may go on is the processes' `connect_timeout` (base: its
//! default, 5 s) and `--wait` (30 s), and their locks must outlast the
//! releases (60 s): all three are scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first, so that sixty
//! processes queueing for twelve connections on a busy machine still all
//! get theirs; a failure names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    io,
    net::{Shutdown, TcpListener, TcpStream},
    process::{Command, Output, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use fencelock_testkit::servers::{mariadb::MariaDbServer, postgres::PostgresServer};

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Small enough that the processes below need several times as many.
const MAX_CONNECTIONS: u32 = 12;
const PROCESSES: usize = 60;

fn fencelock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", url)
        .env_remove("RUST_LOG")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn ok(what: &str, out: &Output) -> serde_json::Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A TCP relay to the server that counts the connections made through it.
struct CountingRelay {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl CountingRelay {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                counter.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                relay(client, server);
            }
        });
        Self { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn relay(client: TcpStream, server: TcpStream) {
    let pipe = |mut from: TcpStream, mut to: TcpStream| {
        thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        })
    };
    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
        pipe(c, s);
        pipe(server, client);
    }
}

/// `url` with its port replaced by `port`.
fn via(url: &str, from: u16, port: u16) -> String {
    url.replace(&format!(":{from}/"), &format!(":{port}/"))
}

/// Each one-shot command (acquire, inspect, release) makes exactly one
/// connection: no separate probe, schema or LISTEN connection.
fn one_shot_commands_use_one_connection(url: &str, port: u16) {
    let relay = CountingRelay::start(port);
    let url = via(url, port, relay.port);
    // Held until the release below.
    let ttl = ms(patience().ttl(Duration::from_secs(60)));
    let mut before = relay.accepted();
    for args in [
        &[
            "--json",
            "acquire",
            "one",
            "--owner",
            "me",
            "--ttl",
            ttl.as_str(),
        ][..],
        &["--json", "inspect", "one"][..],
    ] {
        let out = fencelock(&url, args).output().unwrap();
        let shown = ok(&args.join(" "), &out);
        assert_eq!(
            relay.accepted() - before,
            1,
            "`fencelock {}` made {} connections ({shown})",
            args.join(" "),
            relay.accepted() - before
        );
        before = relay.accepted();
    }
    let token = ok(
        "inspect",
        &fencelock(&url, &["--json", "inspect", "one"])
            .output()
            .unwrap(),
    )["token"]
        .as_u64()
        .unwrap()
        .to_string();
    before = relay.accepted();
    let out = fencelock(
        &url,
        &[
            "--json", "release", "one", "--owner", "me", "--token", &token,
        ],
    )
    .output()
    .unwrap();
    ok("release", &out);
    assert_eq!(relay.accepted() - before, 1, "release");
}

/// More processes than the server has connections, each acquiring and
/// then releasing a key of its own: all succeed.
fn more_processes_than_connections_all_succeed(url: &str) {
    let p = patience();
    let url = &format!(
        "{url}?connect_timeout={}",
        ms(p.bound(Duration::from_secs(5)))
    );
    let (ttl, wait) = (
        ms(p.ttl(Duration::from_secs(60))),
        ms(p.bound(Duration::from_secs(30))),
    );
    let spawn_all = |args: &dyn Fn(usize) -> Vec<String>| -> Vec<Output> {
        let children: Vec<_> = (0..PROCESSES)
            .map(|i| {
                fencelock(url, &args(i).iter().map(String::as_str).collect::<Vec<_>>())
                    .spawn()
                    .unwrap()
            })
            .collect();
        children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect()
    };
    let acquired = spawn_all(&|i| {
        [
            "--json",
            "acquire",
            &format!("k{i}"),
            "--owner",
            &format!("o{i}"),
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(["--ttl", ttl.as_str(), "--wait", wait.as_str()].map(str::to_owned))
        .collect()
    });
    let tokens: Vec<String> = acquired
        .iter()
        .enumerate()
        .map(|(i, out)| {
            ok(&format!("acquire k{i} [{p}]"), out)["token"]
                .as_u64()
                .unwrap()
                .to_string()
        })
        .collect();
    let released = spawn_all(&|i| {
        vec![
            "--json".into(),
            "release".into(),
            format!("k{i}"),
            "--owner".into(),
            format!("o{i}"),
            "--token".into(),
            tokens[i].clone(),
        ]
    });
    for (i, out) in released.iter().enumerate() {
        ok(&format!("release k{i} [{p}]"), out);
    }
}

#[test]
fn postgres() {
    let server = PostgresServer::start_with_max_connections(MAX_CONNECTIONS).unwrap();
    let url = server.url("postgres");
    one_shot_commands_use_one_connection(&url, server.port());
    more_processes_than_connections_all_succeed(&url);
}

#[test]
fn mariadb() {
    let server = MariaDbServer::start_with_max_connections(MAX_CONNECTIONS).unwrap();
    let url = server.url("mysql");
    one_shot_commands_use_one_connection(&url, server.port());
    more_processes_than_connections_all_succeed(&url);
}
