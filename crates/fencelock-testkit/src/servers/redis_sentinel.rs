//! A throwaway Redis Sentinel set: a master and a replica
//! (`redis-server --replicaof`) watched by three Sentinels
//! (`redis-server sentinel.conf --sentinel`, quorum 2), on free loopback
//! ports with a temporary directory each, killed on drop. The master can be
//! failed over through Sentinel (`SENTINEL FAILOVER`) or killed and its
//! replacement awaited.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{
    find_binary,
    members::{Engine, MemberSet, Slot},
    redis::{pongs, Redis},
};
use crate::TestResult;

/// The name the Sentinels know the master by.
pub const MASTER_NAME: &str = "fencelock-test";

/// How long the set gets to form, or a failover to finish.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `down-after-milliseconds`: how long a silent master takes to be judged
/// down (the default, 30 s, would make every failover test slow).
const DOWN_AFTER_MS: u32 = 1000;

/// Members 0 and 1 are data nodes (0 the first master), 2 to 4 Sentinels.
const DATA_NODES: usize = 2;
const SENTINELS: usize = 3;

/// The member command lines of a Sentinel set.
#[derive(Debug)]
pub struct SentinelNode {
    redis: Redis,
    cli: PathBuf,
    first_master: u16,
}

impl Engine for SentinelNode {
    const NAME: &'static str = "redis-server";
    const SCHEME: &'static str = "redis+sentinel";
    const START_TIMEOUT: Duration = START_TIMEOUT;

    fn command(&self, slot: &Slot) -> Command {
        if slot.index < DATA_NODES {
            let mut command = self.redis.command(slot);
            if slot.index > 0 {
                command
                    .arg("--replicaof")
                    .arg("127.0.0.1")
                    .arg(self.first_master.to_string());
            }
            return command;
        }
        // Sentinel rewrites its configuration file with what it learns, so
        // a Sentinel started again keeps following the master of the day.
        let conf = slot.dir.join("sentinel.conf");
        if !conf.exists() {
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                port = slot.client_port,
                dir = slot.dir.display(),
                master = self.first_master,
            );
            // A failure shows as the Sentinel not starting.
            let _ = std::fs::write(&conf, text);
        }
        let mut command = Command::new(self.redis.binary());
        command
            .arg(conf)
            .arg("--sentinel")
            .args(["--loglevel", "warning"]);
        command
    }

    fn serves(&self, slot: &Slot) -> bool {
        pongs(slot)
    }

    /// The data node that calls itself master.
    fn leads(&self, slot: &Slot) -> bool {
        slot.index < DATA_NODES
            && self
                .cli(slot.client_port, &["ROLE"])
                .is_ok_and(|role| role.lines().next() == Some("master"))
    }
}

impl SentinelNode {
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
}

/// See the module docs.
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: MemberSet<SentinelNode>,
}

impl RedisSentinel {
    /// Starts the set without persistence.
    pub fn start() -> TestResult<Self> {
        Self::start_with(false)
    }

    /// As [`RedisSentinel::start`], each data node with `--appendonly yes
    /// --appendfsync always`, so a clean restart keeps every key.
    pub fn start_persistent() -> TestResult<Self> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> TestResult<Self> {
        let nodes = MemberSet::start_with(DATA_NODES + SENTINELS, |slots| {
            Ok(SentinelNode {
                redis: Redis::new(persistent)?,
                cli: find_binary("redis-cli", &[], "redis-tools")?,
                first_master: slots[0].client_port,
            })
        })?;
        let set = Self { nodes };
        set.wait_ready()?;
        Ok(set)
    }

    fn cli(&self, port: u16, args: &[&str]) -> TestResult<String> {
        self.nodes.engine().cli(port, args)
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        (DATA_NODES..self.nodes.len())
            .filter(|&i| self.nodes.is_running(i))
            .map(|i| self.nodes.slot(i).client_port)
            .collect()
    }

    /// The ports of the data nodes (the first master first).
    pub fn data_ports(&self) -> Vec<u16> {
        (0..DATA_NODES)
            .map(|i| self.nodes.slot(i).client_port)
            .collect()
    }

    /// `SENTINEL MASTER` as a Sentinel answers it, field by field.
    fn master_state(&self, sentinel: u16) -> TestResult<HashMap<String, String>> {
        let text = self.cli(sentinel, &["SENTINEL", "MASTER", MASTER_NAME])?;
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines
            .chunks(2)
            .filter_map(|pair| Some((pair.first()?.to_string(), pair.get(1)?.to_string())))
            .collect())
    }

    /// The master's port as the running Sentinels agree on it, once the
    /// node itself says it is master.
    pub fn master_port(&self) -> TestResult<u16> {
        let mut agreed = None;
        for sentinel in self.sentinel_ports() {
            let state = self.master_state(sentinel)?;
            let port: u16 = state.get("port").ok_or("no master port")?.parse()?;
            if agreed.is_some_and(|p| p != port) {
                return Err("the Sentinels disagree on the master".into());
            }
            agreed = Some(port);
        }
        let port = agreed.ok_or("no Sentinel runs")?;
        let role = self.cli(port, &["ROLE"])?;
        if role.lines().next() != Some("master") {
            return Err(format!("{port}, named master, is not one yet").into());
        }
        Ok(port)
    }

    /// Waits until every running Sentinel sees the same master (which says
    /// it is one), the other two Sentinels and a replica, and the replica's
    /// link to the master is up: a failover asked for next can happen.
    pub fn wait_ready(&self) -> TestResult {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let why = self.not_ready().unwrap_or_else(|e| Some(e.to_string()));
            match why {
                None => return Ok(()),
                Some(why) if Instant::now() >= deadline => {
                    return Err(format!("the Sentinel set is not ready: {why}").into())
                }
                Some(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn not_ready(&self) -> TestResult<Option<String>> {
        let master = self.master_port()?;
        for sentinel in self.sentinel_ports() {
            let state = self.master_state(sentinel)?;
            let field = |name: &str| state.get(name).map(String::as_str).unwrap_or("");
            if field("flags") != "master" {
                return Ok(Some(format!(
                    "Sentinel {sentinel}: flags {}",
                    field("flags")
                )));
            }
            if field("num-slaves") != "1" || field("num-other-sentinels") != "2" {
                return Ok(Some(format!(
                    "Sentinel {sentinel} sees {} replicas and {} other Sentinels",
                    field("num-slaves"),
                    field("num-other-sentinels")
                )));
            }
        }
        for port in self.data_ports().into_iter().filter(|&p| p != master) {
            let info = self.cli(port, &["INFO", "replication"])?;
            if !info.contains(&format!("master_port:{master}"))
                || !info.contains("master_link_status:up")
            {
                return Ok(Some(format!("replica {port} is not in sync with {master}")));
            }
        }
        Ok(None)
    }

    /// Waits until the replica has received everything the master had
    /// written when this was called (its offset reaches the master's):
    /// replication is asynchronous, and a test that counts what a failover
    /// loses must tell the client's losses from those of the replication.
    pub fn wait_replicated(&self) -> TestResult {
        let offset = |port: u16, field: &str| -> TestResult<u64> {
            let info = self.cli(port, &["INFO", "replication"])?;
            info.lines()
                .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
                .ok_or_else(|| format!("no {field} in INFO replication of {port}"))?
                .parse::<u64>()
                .map_err(Into::into)
        };
        let master = self.master_port()?;
        let written = offset(master, "master_repl_offset")?;
        let deadline = Instant::now() + START_TIMEOUT;
        for port in self.data_ports().into_iter().filter(|&p| p != master) {
            while offset(port, "slave_repl_offset")? < written {
                if Instant::now() >= deadline {
                    return Err(format!("replica {port} did not reach offset {written}").into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// `redis+sentinel://127.0.0.1:S1,S2,S3/fencelock-test`.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = (DATA_NODES..self.nodes.len())
            .map(|i| self.nodes.endpoint(i))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", sentinels.join(","))
    }

    /// A switchover through Sentinel: writes on the master are paused
    /// first (`CLIENT PAUSE … WRITE`, as Redis's own `FAILOVER` command
    /// does), `SENTINEL FAILOVER` promotes the replica, which by then has
    /// every write, and the old master is turned into its replica and its
    /// clients disconnected before the pause is lifted, so that no write it
    /// held back runs.
    /// Waits until the set is ready again; answers the old master's port
    /// and the new.
    ///
    /// Without the pause the old master goes on granting after the replica
    /// stopped following it, until the Sentinels turn it into a replica: a
    /// grant in that window is lost with it (docs/redis.md, "Exclusion
    /// across a failover"), and its holder overlaps the next one.
    pub fn fail_over(&self) -> TestResult<(u16, u16)> {
        let old = self.master_port()?;
        let sentinel = *self.sentinel_ports().first().ok_or("no Sentinel runs")?;
        // Longer than a failover takes here; lifted once it is done.
        self.cli(old, &["CLIENT", "PAUSE", "30000", "WRITE"])?;
        let turned = self.switch_over(sentinel, old);
        let unpaused = self.cli(old, &["CLIENT", "UNPAUSE"]);
        turned?;
        unpaused?;
        self.await_new_master(old)
    }

    /// `SENTINEL FAILOVER`, then the old master `old` turned into a replica
    /// of the master the Sentinels name instead.
    fn switch_over(&self, sentinel: u16, old: u16) -> TestResult {
        let answer = self.cli(sentinel, &["SENTINEL", "FAILOVER", MASTER_NAME])?;
        if !answer.starts_with("OK") {
            return Err(format!("SENTINEL FAILOVER: {answer}").into());
        }
        let new = self.master_instead_of(old)?;
        let answer = self.cli(old, &["REPLICAOF", "127.0.0.1", &new.to_string()])?;
        if !answer.starts_with("OK") {
            return Err(format!("REPLICAOF on {old}: {answer}").into());
        }
        // As the Sentinels do when they turn a master: its clients' held
        // back writes are dropped with their connections, which then look
        // for the new master, rather than run against a replica.
        self.cli(old, &["CLIENT", "KILL", "TYPE", "normal"])?;
        Ok(())
    }

    /// `kill -9` of data node `port`.
    pub fn kill(&self, port: u16) -> TestResult {
        self.nodes.kill(self.index(port)?)
    }

    /// `kill -9` of every member: the whole set crashes.
    pub fn kill_all(&self) -> TestResult {
        (0..self.nodes.len()).try_for_each(|i| self.nodes.kill(i))
    }

    /// Starts every killed member again and waits until the set is ready.
    pub fn start_stopped(&self) -> TestResult {
        (0..self.nodes.len())
            .filter(|&i| !self.nodes.is_running(i))
            .try_for_each(|i| self.nodes.start_again(i))?;
        self.wait_ready()
    }

    /// `kill -9` of the master; waits until the Sentinels have promoted the
    /// replica. Answers the killed node's port and the new master's.
    pub fn kill_master(&self) -> TestResult<(u16, u16)> {
        let old = self.master_port()?;
        self.kill(old)?;
        Ok((old, self.master_instead_of(old)?))
    }

    /// Waits until the Sentinels name a master other than `old`; answers
    /// its port.
    fn master_instead_of(&self, old: u16) -> TestResult<u16> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.master_port() {
                Ok(new) if new != old => return Ok(new),
                _ if Instant::now() >= deadline => {
                    return Err(format!("no replica took over from {old}").into())
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn await_new_master(&self, old: u16) -> TestResult<(u16, u16)> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(new) = self.master_port() {
                if new != old && self.not_ready().ok().flatten().is_none() {
                    return Ok((old, new));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no failover from {old} within {START_TIMEOUT:?}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn index(&self, port: u16) -> TestResult<usize> {
        (0..self.nodes.len())
            .find(|&i| self.nodes.slot(i).client_port == port)
            .ok_or_else(|| format!("no node on port {port}").into())
    }

    /// SIGSTOP of data node `port`: a hung master accepts connections and
    /// answers nothing, until the Sentinels judge it down.
    pub fn pause(&self, port: u16) -> TestResult {
        self.nodes.pause(self.index(port)?)
    }

    /// SIGCONT of data node `port`, paused by [`RedisSentinel::pause`].
    pub fn resume(&self, port: u16) -> TestResult {
        self.nodes.resume(self.index(port)?)
    }

    /// Starts data node `port` again (killed before): Sentinel turns it
    /// into a replica of the new master. Waits until the set is ready.
    pub fn start_again(&self, port: u16) -> TestResult {
        self.nodes.start_again(self.index(port)?)?;
        self.wait_ready()
    }

    /// A clean stop of every member and a start on the same ports; waits
    /// until the set is ready.
    pub fn restart(&self) -> TestResult {
        self.nodes.restart()?;
        self.wait_ready()
    }
}

impl super::url_factory::UrlServer for RedisSentinel {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        Self::start_persistent()
    }
    fn url(&self) -> String {
        RedisSentinel::url(self)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
    fn can_proxy() -> bool {
        // The Sentinels hand out the master's own address.
        false
    }
}
