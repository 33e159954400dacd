//! `fencelock-testkit-server ENGINE`: one throwaway server of the test kit,
//! for test suites that are not written in Rust (the Node and Python
//! bindings, the foreign-client programs), so that every language's tests
//! start servers the same way the Rust suite does: random loopback ports,
//! temporary data directories, nothing left behind.
//!
//! Engines: `redis`, `redis-persistent`, `redis-sentinel` (a master, a
//! replica and three Sentinels; the URL is `redis+sentinel://…`, the port
//! the master's), `postgres`, `mariadb`, `etcd`, `zookeeper`.
//!
//! Once the server serves, the program prints one JSON line on stdout,
//! `{"engine":…,"url":…,"port":…}`, where `url` is the fencelock URL of the
//! server. It then reads commands from stdin, one per line, and answers each
//! with one line, `ok` or `error: …`:
//!
//! - `pause` / `resume`: SIGSTOP / SIGCONT the server (a stalled server whose
//!   connections stay open; Redis, etcd and ZooKeeper);
//! - `kill` / `start`: SIGKILL it / start it again on the same port and
//!   directory (every engine; `redis-sentinel`: SIGKILL of the master,
//!   answered once the Sentinels promoted the replica, and a start of the
//!   killed node, answered once it is the new master's replica).
//!
//! End of input (the test runner exiting, even by a crash, closes the pipe)
//! stops the server and deletes its directory.

#![forbid(unsafe_code)]

use std::io::{BufRead, Write};

use fencelock_testkit::servers::{
    etcd::EtcdCluster,
    mariadb::MariaDbServer,
    members::{Engine, MemberSet},
    postgres::PostgresServer,
    redis::RedisServer,
    redis_sentinel::RedisSentinel,
    zookeeper::ZkServer,
};
use fencelock_testkit::TestResult;

/// What the control commands can do to a started server. Pausing needs one
/// process to stop: PostgreSQL and MariaDB serve from several (a stopped
/// postmaster leaves its backends answering), so they only kill and start.
trait Server {
    fn pause(&mut self) -> TestResult {
        Err("this engine cannot be paused (it runs several processes)".into())
    }
    fn resume(&mut self) -> TestResult {
        Err("this engine cannot be paused (it runs several processes)".into())
    }
    fn kill(&mut self) -> TestResult;
    fn start(&mut self) -> TestResult;
}

impl<E: Engine> Server for MemberSet<E> {
    fn pause(&mut self) -> TestResult {
        MemberSet::pause(self, 0)
    }
    fn resume(&mut self) -> TestResult {
        MemberSet::resume(self, 0)
    }
    fn kill(&mut self) -> TestResult {
        MemberSet::kill(self, 0)
    }
    fn start(&mut self) -> TestResult {
        self.start_again(0)
    }
}

impl Server for PostgresServer {
    fn kill(&mut self) -> TestResult {
        PostgresServer::kill(self)
    }
    fn start(&mut self) -> TestResult {
        self.start_again()
    }
}

impl Server for MariaDbServer {
    fn kill(&mut self) -> TestResult {
        MariaDbServer::kill(self)
    }
    fn start(&mut self) -> TestResult {
        self.start_again()
    }
}

impl Server for RedisSentinel {
    fn kill(&mut self) -> TestResult {
        self.kill_master().map(|_| ())
    }
    fn start(&mut self) -> TestResult {
        self.start_stopped()
    }
}

/// A started server, its fencelock URL and its client port.
type Started = (Box<dyn Server>, String, u16);

fn start(engine: &str) -> TestResult<Started> {
    fn members<E: Engine>(set: MemberSet<E>) -> Started {
        let url = set.url();
        let port = set.slot(0).client_port;
        (Box::new(set), url, port)
    }
    Ok(match engine {
        "redis" => members(RedisServer::start()?),
        "redis-persistent" => members(RedisServer::start_persistent()?),
        "redis-sentinel" => {
            let set = RedisSentinel::start()?;
            let (url, port) = (set.url(), set.master_port()?);
            (Box::new(set), url, port)
        }
        "etcd" => members(EtcdCluster::start()?),
        "zookeeper" => members(ZkServer::start()?),
        "postgres" => {
            let server = PostgresServer::start()?;
            let (url, port) = (server.url("postgres"), server.port());
            (Box::new(server), url, port)
        }
        "mariadb" => {
            let server = MariaDbServer::start()?;
            let (url, port) = (server.url("mysql"), server.port());
            (Box::new(server), url, port)
        }
        other => {
            return Err(format!(
            "unknown engine {other:?}: one of redis, redis-persistent, redis-sentinel, postgres, \
                 mariadb, etcd, zookeeper"
        )
            .into())
        }
    })
}

fn control(server: &mut dyn Server, command: &str) -> TestResult {
    match command {
        "pause" => server.pause(),
        "resume" => server.resume(),
        "kill" => server.kill(),
        "start" => server.start(),
        other => Err(format!("unknown command {other:?}: pause, resume, kill or start").into()),
    }
}

fn main() {
    let engine = std::env::args().nth(1).unwrap_or_default();
    let (mut server, url, port) = match start(&engine) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("fencelock-testkit-server: {e}");
            std::process::exit(1);
        }
    };
    let line = serde_json::json!({ "engine": engine, "url": url, "port": port });
    let mut out = std::io::stdout().lock();
    // A runner that went away before reading the line gets no server.
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        return;
    }
    for command in std::io::stdin().lock().lines() {
        let Ok(command) = command else { break };
        let answer = match control(server.as_mut(), command.trim()) {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("error: {e}"),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    // Dropping `server` stops the server and deletes its directory.
}
