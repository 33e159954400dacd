//! A set of independent throwaway `redis-server`s (no replication, no
//! cluster), as the `redlock://` backend uses them: each node can be
//! killed, paused and restarted on its own.

use nix::sys::signal::Signal;

use super::redis::RedisServer;
use crate::TestResult;

/// How many nodes a set has unless told otherwise.
pub const DEFAULT_NODES: usize = 3;

/// `n` [`RedisServer`]s on free loopback ports, killed on drop.
#[derive(Debug)]
pub struct RedisSet {
    nodes: Vec<RedisServer>,
}

impl RedisSet {
    /// Starts `n` servers without persistence: a restarted node has lost
    /// every key.
    pub fn start(n: usize) -> TestResult<Self> {
        Ok(Self {
            nodes: (0..n)
                .map(|_| RedisServer::start())
                .collect::<TestResult<_>>()?,
        })
    }

    /// Starts `n` servers with AOF (`fsync always`): a clean restart keeps
    /// every key.
    pub fn start_persistent(n: usize) -> TestResult<Self> {
        Ok(Self {
            nodes: (0..n)
                .map(|_| RedisServer::start_persistent())
                .collect::<TestResult<_>>()?,
        })
    }

    /// The nodes, in URL order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`; an error when there is no such node.
    pub fn node(&self, i: usize) -> TestResult<&RedisServer> {
        self.nodes
            .get(i)
            .ok_or_else(|| format!("the set has no node {i}").into())
    }

    /// `redlock://127.0.0.1:P1,127.0.0.1:P2,…` (no query).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    /// SIGKILL of node `i` and an immediate start on the same port: without
    /// persistence it comes back empty.
    pub fn crash_restart(&self, i: usize) -> TestResult {
        let node = self.node(i)?;
        node.kill()?;
        node.start_again()
    }

    /// Sends `signal` to node `i` (SIGSTOP / SIGCONT to pause and resume).
    pub fn signal(&self, i: usize, signal: Signal) -> TestResult {
        self.node(i)?.signal(signal)
    }
}

impl super::url_factory::UrlServer for RedisSet {
    fn start_shared() -> TestResult<Self> {
        Self::start(DEFAULT_NODES)
    }
    fn start_dedicated() -> TestResult<Self> {
        // Restart cases expect a clean restart to keep live leases.
        Self::start_persistent(DEFAULT_NODES)
    }
    fn url(&self) -> String {
        RedisSet::url(self)
    }
    fn case_url(&self, case: usize) -> String {
        // The fault cases hold replies back for a second and expect the
        // request to wait for them; redlock's default per-node bound
        // (250 ms) would give up on every node first.
        format!("{}?prefix=case{case}&node_timeout=3s", self.url())
    }
    fn restart_server(&self) -> TestResult {
        // A clean restart of every node (what the case asks of "the
        // server"); one node at a time is what the redlock tests do.
        self.nodes.iter().try_for_each(RedisServer::restart)
    }
}
