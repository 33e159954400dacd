//! A throwaway Redis Cluster: three primaries and three replicas
//! (`redis-server --cluster-enabled yes`, joined by `redis-cli --cluster
//! create … --cluster-replicas 1`), on free loopback ports with a temporary
//! directory each, killed on drop. A primary can be killed (`kill -9`) and
//! its replica's promotion awaited, and a killed node started again (it
//! rejoins as a replica).

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::{
    find_binary,
    members::{Engine, MemberSet, Slot},
    redis::{pongs, Redis},
};
use crate::TestResult;

/// How long a node gets to accept connections, and the cluster to form or
/// to finish a failover.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `cluster-node-timeout`: how long a silent primary takes to be declared
/// failed (the Redis default, 15 s, would make every failover test slow).
const NODE_TIMEOUT_MS: u32 = 1000;

/// One line of `CLUSTER NODES`, as far as the tests need it.
#[derive(Clone, Debug)]
struct NodeLine {
    port: u16,
    myself: bool,
    primary: bool,
    failed: bool,
    connected: bool,
    slots: Vec<(u16, u16)>,
}

/// A `redis-server` with cluster mode on, its state in its own
/// `nodes.conf`, so that a node started again finds its role.
#[derive(Debug)]
pub struct ClusterNode {
    redis: Redis,
    cli: PathBuf,
}

impl Engine for ClusterNode {
    const NAME: &'static str = "redis-server";
    const SCHEME: &'static str = "redis+cluster";
    const START_TIMEOUT: Duration = START_TIMEOUT;

    fn command(&self, slot: &Slot) -> Command {
        let mut command = self.redis.command(slot);
        command
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(slot.dir.join("nodes.conf"))
            .arg("--cluster-node-timeout")
            .arg(NODE_TIMEOUT_MS.to_string());
        command
    }

    /// A node answers before it is part of a cluster; [`RedisCluster`]
    /// waits for the cluster's health itself.
    fn serves(&self, slot: &Slot) -> bool {
        pongs(slot)
    }

    /// A primary that serves slots.
    fn leads(&self, slot: &Slot) -> bool {
        self.cluster_nodes(slot.client_port).is_ok_and(|lines| {
            lines
                .iter()
                .any(|n| n.myself && n.primary && !n.failed && !n.slots.is_empty())
        })
    }
}

impl ClusterNode {
    /// `redis-cli -p PORT ARGS…`, its output.
    fn cli(&self, port: u16, args: &[&str]) -> TestResult<String> {
        let out = Command::new(&self.cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(format!("redis-cli -p {port} {args:?} failed").into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `CLUSTER NODES` as seen by node `port`.
    fn cluster_nodes(&self, port: u16) -> TestResult<Vec<NodeLine>> {
        let text = self.cli(port, &["CLUSTER", "NODES"])?;
        let mut lines = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags), Some(link)) =
                (fields.get(1), fields.get(2), fields.get(7))
            else {
                continue;
            };
            let port = addr
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("bad CLUSTER NODES line {line:?}"))?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            lines.push(NodeLine {
                port,
                myself: flags.contains("myself"),
                primary: flags.contains("master"),
                failed: flags.contains("fail"),
                connected: *link == "connected",
                slots,
            });
        }
        Ok(lines)
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: MemberSet<ClusterNode>,
    /// Nodes paused by [`RedisCluster::pause`]: running, but asked nothing
    /// (they would never answer).
    paused: Mutex<Vec<u16>>,
}

impl RedisCluster {
    /// Starts three primaries and three replicas without persistence.
    pub fn start() -> TestResult<Self> {
        Self::start_with(false)
    }

    /// As [`RedisCluster::start`], each node with `--appendonly yes
    /// --appendfsync always`, so a clean restart keeps every key.
    pub fn start_persistent() -> TestResult<Self> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> TestResult<Self> {
        let nodes = MemberSet::start_with(6, |_| {
            Ok(ClusterNode {
                redis: Redis::new(persistent)?,
                cli: find_binary("redis-cli", &[], "redis-tools")?,
            })
        })?;
        let mut create = Command::new(&nodes.engine().cli);
        create.args(["--cluster", "create"]);
        for i in 0..nodes.len() {
            create.arg(nodes.endpoint(i));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let cluster = Self {
            nodes,
            paused: Mutex::new(Vec::new()),
        };
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    fn cli(&self, port: u16, args: &[&str]) -> TestResult<String> {
        self.nodes.engine().cli(port, args)
    }

    fn cluster_nodes(&self, port: u16) -> TestResult<Vec<NodeLine>> {
        self.nodes.engine().cluster_nodes(port)
    }

    /// The member index of the node on `port`.
    fn index(&self, port: u16) -> TestResult<usize> {
        (0..self.nodes.len())
            .find(|&i| self.nodes.slot(i).client_port == port)
            .ok_or_else(|| format!("no node on port {port}").into())
    }

    /// The ports of the nodes that run and answer: neither killed nor
    /// paused.
    fn running(&self) -> Vec<u16> {
        let paused = self.paused.lock().unwrap_or_else(PoisonError::into_inner);
        (0..self.nodes.len())
            .filter(|&i| self.nodes.is_running(i))
            .map(|i| self.nodes.slot(i).client_port)
            .filter(|port| !paused.contains(port))
            .collect()
    }

    /// Waits until every running node reports `cluster_state:ok`, sees
    /// every other running node connected, and every primary that serves
    /// slots has a replica in sync (so that a primary killed next can be
    /// replaced).
    pub fn wait_healthy(&self) -> TestResult {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let healthy = self.is_healthy().unwrap_or_else(|e| Some(e.to_string()));
            match healthy {
                None => return Ok(()),
                Some(why) if Instant::now() >= deadline => {
                    return Err(format!(
                        "the redis cluster is not healthy: {why}\n{}",
                        self.describe()
                    )
                    .into())
                }
                Some(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// What a node answers to `CLUSTER NODES` and every node to `INFO
    /// replication`, for an error that must say why the cluster is not
    /// healthy.
    fn describe(&self) -> String {
        let mut out = String::new();
        let Some(&any) = self.running().first() else {
            return "no node runs".into();
        };
        match self.cli(any, &["CLUSTER", "NODES"]) {
            Ok(text) => out.push_str(&format!("CLUSTER NODES on {any}:\n{text}")),
            Err(e) => out.push_str(&format!("CLUSTER NODES on {any}: {e}\n")),
        }
        for port in self.running() {
            let role = self
                .cli(port, &["INFO", "replication"])
                .map(|info| {
                    info.lines()
                        .filter(|l| {
                            l.starts_with("role:")
                                || l.starts_with("slave")
                                || l.starts_with("master_link_status")
                                || l.starts_with("master_sync_in_progress")
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!("INFO replication on {port}: {role}\n"));
        }
        out
    }

    /// `None` when healthy, else why not.
    fn is_healthy(&self) -> TestResult<Option<String>> {
        let running = self.running();
        for &port in &running {
            let info = self.cli(port, &["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") {
                return Ok(Some(format!("node {port} is not ok")));
            }
            let seen = self.cluster_nodes(port)?;
            for &other in &running {
                if !seen
                    .iter()
                    .any(|n| n.port == other && n.connected && !n.failed)
                {
                    return Ok(Some(format!("node {port} does not see {other}")));
                }
            }
            if seen
                .iter()
                .filter(|n| n.primary && !n.slots.is_empty())
                .count()
                != 3
            {
                return Ok(Some(format!("node {port} does not see three primaries")));
            }
        }
        let Some(&any) = running.first() else {
            return Ok(Some("no node runs".into()));
        };
        for primary in self
            .cluster_nodes(any)?
            .iter()
            .filter(|n| n.primary && !n.slots.is_empty())
        {
            let info = self.cli(primary.port, &["INFO", "replication"])?;
            if !info.contains("state=online") {
                return Ok(Some(format!(
                    "primary {} has no replica online",
                    primary.port
                )));
            }
        }
        Ok(None)
    }

    /// `redis+cluster://127.0.0.1:P1,…` naming every node.
    pub fn url(&self) -> String {
        self.nodes.url()
    }

    /// Every node's port, in the order of [`RedisCluster::url`].
    pub fn ports(&self) -> Vec<u16> {
        (0..self.nodes.len())
            .map(|i| self.nodes.slot(i).client_port)
            .collect()
    }

    /// The slot of the key named `name` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, name: &str) -> TestResult<u16> {
        let port = *self.running().first().ok_or("no node runs")?;
        Ok(self
            .cli(port, &["CLUSTER", "KEYSLOT", name])?
            .trim()
            .parse()?)
    }

    /// The port of the primary serving `slot`, as a running node sees it.
    pub fn primary_of(&self, slot: u16) -> TestResult<u16> {
        let port = *self.running().first().ok_or("no node runs")?;
        self.cluster_nodes(port)?
            .into_iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|n| n.port)
            .ok_or_else(|| format!("no primary serves slot {slot}").into())
    }

    /// The ports of the primaries that serve slots.
    pub fn primaries(&self) -> TestResult<Vec<u16>> {
        let port = *self.running().first().ok_or("no node runs")?;
        Ok(self
            .cluster_nodes(port)?
            .into_iter()
            .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect())
    }

    /// `kill -9` of node `port`.
    pub fn kill(&self, port: u16) -> TestResult {
        self.nodes.kill(self.index(port)?)
    }

    /// SIGSTOP of node `port`: it stops answering without closing its
    /// connections (and is declared failed after `cluster-node-timeout`).
    /// Until [`RedisCluster::resume`], the other methods ask other nodes.
    pub fn pause(&self, port: u16) -> TestResult {
        self.nodes.pause(self.index(port)?)?;
        self.paused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(port);
        Ok(())
    }

    /// SIGCONT of node `port`, paused by [`RedisCluster::pause`].
    pub fn resume(&self, port: u16) -> TestResult {
        self.nodes.resume(self.index(port)?)?;
        self.paused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&p| p != port);
        Ok(())
    }

    /// `kill -9` of every node: the whole cluster crashes.
    pub fn kill_all(&self) -> TestResult {
        (0..self.nodes.len()).try_for_each(|i| self.nodes.kill(i))
    }

    /// Starts every killed node again and waits until the cluster is
    /// healthy: each node finds its role in its `nodes.conf`.
    pub fn start_stopped(&self) -> TestResult {
        (0..self.nodes.len())
            .filter(|&i| !self.nodes.is_running(i))
            .try_for_each(|i| self.nodes.start_again(i))?;
        self.wait_healthy()
    }

    /// `kill -9` of the primary serving `slot`, then waits until a replica
    /// has taken over its slots and the cluster is `ok` again. Answers the
    /// killed node's port and the new primary's.
    pub fn fail_over(&self, slot: u16) -> TestResult<(u16, u16)> {
        let old = self.primary_of(slot)?;
        self.kill(old)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let promoted = self.primary_of(slot).ok().filter(|&p| p != old);
            let ok = self.running().iter().all(|&p| {
                self.cli(p, &["CLUSTER", "INFO"])
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
            if let (Some(new), true) = (promoted, ok) {
                return Ok((old, new));
            }
            if Instant::now() >= deadline {
                return Err(format!("no replica took over slot {slot} from {old}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts node `port` again (killed before); it rejoins as a replica of
    /// the primary that replaced it. Waits until the cluster is healthy.
    pub fn start_again(&self, port: u16) -> TestResult {
        self.nodes.start_again(self.index(port)?)?;
        self.wait_healthy()
    }

    /// A clean stop of every node (SIGTERM, so each flushes what it
    /// persists) and a start on the same ports; waits until healthy.
    pub fn restart(&self) -> TestResult {
        self.nodes.restart()?;
        self.wait_healthy()
    }
}

impl super::url_factory::UrlServer for RedisCluster {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        // Restart cases expect a clean restart to keep live leases.
        Self::start_persistent()
    }
    fn url(&self) -> String {
        RedisCluster::url(self)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
    fn can_proxy() -> bool {
        // The cluster client learns every node's own address from
        // `CLUSTER SLOTS`, so a proxy in front of the seed nodes would see
        // only the first request.
        false
    }
}
