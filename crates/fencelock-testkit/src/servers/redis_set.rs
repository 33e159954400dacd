//! A set of independent throwaway `redis-server`s (no replication, no
//! cluster), as the `redlock://` backend uses them: each node can be
//! killed, paused and restarted on its own.

use std::{process::Command, time::Duration};

use super::{
    members::{Engine, MemberSet, Slot},
    redis::{pongs, Redis},
};
use crate::TestResult;

/// How many nodes a set has unless told otherwise.
pub const DEFAULT_NODES: usize = 3;

/// Independent `redis-server`s on free loopback ports, killed on drop; its
/// URL is `redlock://127.0.0.1:P1,127.0.0.1:P2,…` (no query).
pub type RedisSet = MemberSet<RedlockNode>;

/// A `redis-server` that is one vote of a Redlock set: no node leads.
#[derive(Debug)]
pub struct RedlockNode(Redis);

impl Engine for RedlockNode {
    const NAME: &'static str = "redis-server";
    const SCHEME: &'static str = "redlock";
    const START_TIMEOUT: Duration = Redis::START_TIMEOUT;

    fn command(&self, slot: &Slot) -> Command {
        self.0.command(slot)
    }

    fn serves(&self, slot: &Slot) -> bool {
        pongs(slot)
    }

    fn leads(&self, _: &Slot) -> bool {
        false
    }
}

impl MemberSet<RedlockNode> {
    /// Starts `n` servers without persistence: a restarted node has lost
    /// every key.
    pub fn start(n: usize) -> TestResult<Self> {
        Self::start_with(n, |_| Ok(RedlockNode(Redis::new(false)?)))
    }

    /// Starts `n` servers with AOF (`fsync always`): a clean restart keeps
    /// every key.
    pub fn start_persistent(n: usize) -> TestResult<Self> {
        Self::start_with(n, |_| Ok(RedlockNode(Redis::new(true)?)))
    }

    /// `redis://127.0.0.1:PORT` of node `i` alone.
    pub fn node_url(&self, i: usize) -> String {
        format!("redis://{}", self.endpoint(i))
    }

    /// SIGKILL of node `i` and an immediate start on the same port: without
    /// persistence it comes back empty.
    pub fn crash_restart(&self, i: usize) -> TestResult {
        self.kill(i)?;
        self.start_again(i)
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
        MemberSet::url(self)
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
        self.restart()
    }
}
