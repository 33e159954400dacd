//! Throwaway `redis-server` processes: one server (`redis://`), a set of
//! independent nodes (`redlock://`, in [`super::redis_set`]) and the nodes
//! of a cluster (`redis+cluster://`, in [`super::redis_cluster`]). All three
//! run the [`Redis`] engine's command line; their lifecycle is the [`MemberSet`]'s.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use super::{
    find_binary,
    members::{Engine, MemberSet, SingleServer, Slot},
};
use crate::TestResult;

/// A `redis-server` on a free loopback port with its own temporary
/// directory, killed on drop. It can be killed and started again on the
/// same port, with or without persistence.
pub type RedisServer = MemberSet<Redis>;

/// How a `redis-server` runs: with or without an append-only file.
#[derive(Debug)]
pub struct Redis {
    binary: PathBuf,
    persistent: bool,
}

impl Redis {
    /// Finds `redis-server`. Without persistence (`--save ""
    /// --appendonly no`) a restart loses every key; with it (`--appendonly
    /// yes --appendfsync always`) keys survive a restart (leases with their
    /// absolute expiry, token counters).
    pub fn new(persistent: bool) -> TestResult<Self> {
        Ok(Self {
            binary: find_binary("redis-server", &[], "redis-server")?,
            persistent,
        })
    }

    /// The `redis-server` binary (Sentinels run it too).
    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }
}

impl Engine for Redis {
    const NAME: &'static str = "redis-server";
    const SCHEME: &'static str = "redis";
    const START_TIMEOUT: Duration = Duration::from_secs(20);

    /// The command line of a server at `slot`, whatever the layout (the
    /// Redlock and cluster engines start from it).
    fn command(&self, slot: &Slot) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("--port")
            .arg(slot.client_port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args([
                "--appendonly",
                if self.persistent { "yes" } else { "no" },
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&slot.dir)
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            // Room for a database per conformance case where a key prefix
            // does not separate cases (`PlainRedis`).
            .args(["--databases", "1024"]);
        command
    }

    fn serves(&self, slot: &Slot) -> bool {
        pongs(slot)
    }

    fn leads(&self, _: &Slot) -> bool {
        true
    }
}

impl SingleServer for Redis {
    fn start_single() -> TestResult<RedisServer> {
        RedisServer::start()
    }

    fn start_single_durable() -> TestResult<RedisServer> {
        RedisServer::start_persistent()
    }
}

impl MemberSet<Redis> {
    /// Starts a server without persistence: a restart loses every key.
    pub fn start() -> TestResult<Self> {
        Self::start_with(1, |_| Redis::new(false))
    }

    /// Starts a server with an append-only file: keys survive a restart.
    pub fn start_persistent() -> TestResult<Self> {
        Self::start_with(1, |_| Redis::new(true))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.slot(0).client_port
    }
}

/// Whether the server at `slot` answers `PING`: it accepts connections while
/// it still loads its append-only file, and answers `-LOADING` until done.
pub(super) fn pongs(slot: &Slot) -> bool {
    let answer = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&slot.addr(), Duration::from_millis(500))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"PING\r\n")?;
        let mut reply = [0; 7];
        s.read_exact(&mut reply)?;
        Ok(&reply == b"+PONG\r\n")
    };
    answer().unwrap_or(false)
}

/// A [`RedisServer`] whose conformance cases use the `plain` layout
/// (docs/redis.md), each in a database of its own: its lock keys are the
/// users' keys, which no key prefix separates.
#[derive(Debug)]
pub struct PlainRedis(pub RedisServer);

impl super::url_factory::UrlServer for PlainRedis {
    fn start_shared() -> TestResult<Self> {
        RedisServer::start().map(Self)
    }
    fn start_dedicated() -> TestResult<Self> {
        RedisServer::start_persistent().map(Self)
    }
    fn url(&self) -> String {
        self.0.url()
    }
    fn case_url(&self, case: usize) -> String {
        format!("{}/{case}?prefix=case{case}&layout=plain", self.0.url())
    }
    fn restart_server(&self) -> TestResult {
        self.0.restart()
    }
}
