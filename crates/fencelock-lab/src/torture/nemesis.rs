//! The nemesis: injects one fault at a time on a schedule drawn from the
//! seed, and waits for the system to make progress again before the next.
//!
//! The seed decides the schedule (gaps, kinds, durations). The victim of a
//! pause or partition is chosen where it hurts: a worker between its read
//! and its write if there is one (found in the store's history), else the
//! current holder, else a worker drawn from the seed. A replay with the same
//! seed therefore injects the same faults at the same times, and the victims
//! follow what the workers are doing.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use clap::ValueEnum;
use fencelock::{Error, LockClient};
use fencelock_testkit::{
    proxy::{Direction, ProxiedUrl},
    servers::{
        etcd::EtcdCluster,
        mariadb::MariaDbServer,
        postgres::PostgresServer,
        redis::RedisServer,
        redis_cluster::RedisCluster,
        redis_sentinel::RedisSentinel,
        redis_set::RedisSet,
        replicas::{Haproxy, ServeReplicas},
        zookeeper::ZkServer,
    },
    TestResult,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use super::{
    history::{now_us, Event, Kind, SharedStore},
    shards::ShardSteps,
};
use crate::{topology::Lab, Output};

/// What the nemesis can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP a worker for 1.5–3 × the lease, then SIGCONT: a GC pause.
    Pause,
    /// Cut a worker off from the lock backend for 1.5–3 × the lease.
    Partition,
    /// Delay a worker's traffic by 0.1–0.3 × the lease per chunk, each way,
    /// for 1.5–3 × the lease.
    Latency,
    /// Reset a worker's connections to the lock backend.
    Reset,
    /// kill -9 the lock server (every member of an etcd cluster; one
    /// `fencelock serve` replica of `--server replicas`), start it again on
    /// the same data 0.75–1.5 × the lease later.
    Restart,
    /// kill -9 the etcd or ZooKeeper leader (a Redis Cluster: the primary
    /// of the key's slot, which its replica replaces; Redis Sentinel: the
    /// master, which the Sentinels fail over to the replica), start it
    /// again 1.5–3 × the lease later.
    Leader,
    /// Step a `--server sharded` map to its next transition step, then
    /// wait until every worker has reopened on it (docs/sharding.md).
    Reshard,
    /// Cut a lab's site off from the others (every link with one end
    /// there, workers' and members' alike) for 1.5–3 × the lease, then
    /// heal: the site of a worker chosen as for a partition
    /// (`--topology`; docs/multi-dc.md).
    Isolate,
}

impl FaultKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Partition => "partition",
            FaultKind::Latency => "latency",
            FaultKind::Reset => "reset",
            FaultKind::Restart => "restart",
            FaultKind::Leader => "leader",
            FaultKind::Reshard => "reshard",
            FaultKind::Isolate => "isolate",
        }
    }

    /// Whether the fault acts through the workers' fault proxies.
    pub fn needs_proxy(self) -> bool {
        matches!(
            self,
            FaultKind::Partition | FaultKind::Latency | FaultKind::Reset
        )
    }
}

/// A throwaway lock server the harness started and may crash.
#[derive(Debug)]
pub enum Server {
    /// PostgreSQL.
    Postgres(PostgresServer),
    /// MariaDB.
    MariaDb(MariaDbServer),
    /// Redis, without persistence: a restart forgets every lease and the
    /// token counter (which is re-seeded from the server's clock).
    Redis(RedisServer),
    /// A Redis Cluster (three primaries, three replicas), without
    /// persistence; its "leader" is the primary of the torture key's slot.
    RedisCluster(RedisCluster),
    /// A master, a replica and three Sentinels, without persistence; its
    /// leader is the master.
    RedisSentinel(RedisSentinel),
    /// Independent Redis nodes for `redlock://`, and the next node a
    /// restart hits.
    Redlock(RedisSet, usize),
    /// etcd, one member or several.
    Etcd(EtcdCluster),
    /// ZooKeeper, standalone or an ensemble.
    Zookeeper(ZkServer),
    /// A shard map over two SQLite files, stepped by `reshard`.
    Sharded(ShardSteps),
    /// `fencelock serve` replicas behind HAProxy.
    Replicas(ServiceReplicas),
}

/// Three `fencelock serve` replicas (this very binary) over one Redis with
/// persistence, behind HAProxy, and the next replica a restart kills.
#[derive(Debug)]
pub struct ServiceReplicas {
    // Dropped in this order: the balancer, the replicas, then their store.
    balancer: Haproxy,
    replicas: ServeReplicas,
    _redis: RedisServer,
    next: usize,
}

impl ServiceReplicas {
    /// Starts Redis, the replicas and the balancer.
    pub fn start() -> TestResult<Self> {
        let redis = RedisServer::start_persistent()?;
        let binary = std::env::current_exe()?;
        let replicas = ServeReplicas::start(&binary, &redis.url(), 3, &[])?;
        let ports: Vec<u16> = (0..replicas.len()).map(|i| replicas.port(i)).collect();
        let balancer = Haproxy::start(&ports)?;
        Ok(Self {
            balancer,
            replicas,
            _redis: redis,
            next: 0,
        })
    }
}

impl Server {
    /// The URL of the server's lock store.
    pub fn url(&self) -> String {
        match self {
            Server::Postgres(s) => s.url("postgres"),
            Server::MariaDb(s) => s.url("mysql"),
            Server::Redis(s) => s.url(),
            Server::RedisCluster(c) => c.url(),
            Server::RedisSentinel(s) => s.url(),
            // A restarted node sits out max_ttl: short, so that a one-minute
            // run sees nodes come back (the lease, 2 s by default, must fit).
            Server::Redlock(set, _) => format!("{}?max_ttl=5s", set.url()),
            Server::Etcd(c) => c.url(),
            Server::Zookeeper(z) => z.url(),
            Server::Sharded(m) => m.url(),
            Server::Replicas(r) => r.balancer.url(),
        }
    }

    /// kill -9 of the whole server.
    fn crash(&mut self) -> TestResult {
        match self {
            Server::Postgres(s) => s.kill(),
            Server::MariaDb(s) => s.kill(),
            Server::Redis(s) => s.kill(0),
            Server::RedisCluster(c) => c.kill_all(),
            Server::RedisSentinel(s) => s.kill_all(),
            // One node, restarted empty at once: the fault Redlock must
            // survive (its quarantine and token floor).
            Server::Redlock(set, next) => {
                let victim = *next % set.len();
                *next += 1;
                set.crash_restart(victim)
            }
            Server::Etcd(c) => (0..c.len()).try_for_each(|i| c.kill(i)),
            Server::Zookeeper(z) => (0..z.len()).try_for_each(|i| z.kill(i)),
            Server::Sharded(_) => Err(FILES.into()),
            Server::Replicas(r) => {
                let victim = r.next % r.replicas.len();
                r.next += 1;
                r.replicas.kill(victim)
            }
        }
    }

    /// Starts what [`crash`](Self::crash) or a leader kill stopped.
    fn start_again(&mut self) -> TestResult {
        match self {
            Server::Postgres(s) => s.start_again(),
            Server::MariaDb(s) => s.start_again(),
            Server::Redis(s) => s.start_again(0),
            Server::RedisCluster(c) => c.start_stopped(),
            Server::RedisSentinel(s) => s.start_stopped(),
            Server::Redlock(set, _) => set.resume(0),
            Server::Etcd(c) => (0..c.len())
                .filter(|&i| !c.is_running(i))
                .try_for_each(|i| c.start_again(i)),
            Server::Zookeeper(z) => (0..z.len())
                .filter(|&i| !z.is_running(i))
                .try_for_each(|i| z.start_again(i)),
            Server::Sharded(_) => Err(FILES.into()),
            Server::Replicas(r) => (0..r.replicas.len())
                .filter(|&i| !r.replicas.is_running(i))
                .try_for_each(|i| r.replicas.start_again(i)),
        }
    }

    /// Writes the next step of a shard map; its epoch.
    fn reshard(&mut self) -> TestResult<u64> {
        match self {
            Server::Sharded(m) => m.advance(),
            _ => Err("only a --server sharded map can be resharded".into()),
        }
    }

    /// kill -9 of the etcd or ZooKeeper leader, or of the Redis Cluster
    /// primary serving `key` (whose slot is that of the hash tag `{key}`
    /// for a key without `{ } % * ? [ ] \`, which the backend would
    /// encode); which member (a Redis node: its port) it was, if there was
    /// one.
    fn kill_leader(&mut self, key: &str) -> TestResult<Option<usize>> {
        match self {
            Server::Etcd(c) => match c.leader() {
                Some(i) => c.kill(i).map(|()| Some(i)),
                None => Ok(None),
            },
            Server::Redlock(set, _) => set.pause(0).map(|()| Some(0)),
            Server::Zookeeper(z) => match z.leader() {
                Some(i) => z.kill(i).map(|()| Some(i)),
                None => Ok(None),
            },
            // Every primary holds slots; the one to kill is the one the
            // workers write to.
            Server::RedisCluster(c) => {
                let slot = c.keyslot(&format!("{{{key}}}"))?;
                let port = c.primary_of(slot)?;
                c.kill(port).map(|()| Some(usize::from(port)))
            }
            // The Sentinels judge it down and promote the replica.
            Server::RedisSentinel(s) => {
                let port = s.master_port()?;
                s.kill(port).map(|()| Some(usize::from(port)))
            }
            _ => Err(
                "only an etcd cluster, a ZooKeeper ensemble, a Redis Cluster or a Sentinel set \
                 has a leader to kill"
                    .into(),
            ),
        }
    }
}

/// Why a shard map of files cannot crash.
const FILES: &str = "a shard map of SQLite files has no server to crash";

/// A server shared with blocking threads.
pub type SharedServer = Arc<Mutex<Server>>;

async fn with_server<T: Send + 'static>(
    server: &SharedServer,
    f: impl FnOnce(&mut Server) -> TestResult<T> + Send + 'static,
) -> Result<T, Error> {
    let server = Arc::clone(server);
    tokio::task::spawn_blocking(move || {
        f(&mut server.lock().unwrap_or_else(PoisonError::into_inner)).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|e| {
        fencelock::BackendError::message("torture server", fencelock::ErrorStatus::Permanent, e)
            .into()
    })
}

/// What the nemesis works on.
pub struct Targets {
    /// Worker process ids, by worker number.
    pub pids: Vec<u32>,
    /// Each worker's proxies to the lock backend (empty without proxy
    /// faults).
    pub proxies: Vec<ProxiedUrl>,
    /// The server, when the harness owns it.
    pub server: Option<SharedServer>,
    /// A client that bypasses the proxies: it finds the holder.
    pub direct: LockClient,
    /// The shared key.
    pub key: String,
    /// The store, read for progress and victims.
    pub store: SharedStore,
    /// The lab the workers run in (`--topology`), and each worker's site.
    pub lab: Option<(Arc<Lab>, Vec<usize>)>,
}

impl Targets {
    /// SIGCONT to every worker and every proxy healed: the end of any fault.
    pub fn calm(&self) {
        for &pid in &self.pids {
            let _ = signal(pid, Signal::SIGCONT);
        }
        for proxy in &self.proxies {
            proxy.heal();
        }
        if let Some((lab, _)) = &self.lab {
            lab.heal();
        }
    }
}

fn signal(pid: u32, signal: Signal) -> Result<(), Error> {
    let pid = i32::try_from(pid).map_err(|_| Error::InvalidArgument(format!("pid {pid}")))?;
    kill(Pid::from_raw(pid), signal).map_err(|e| {
        fencelock::BackendError::message(
            "torture",
            fencelock::ErrorStatus::Permanent,
            format!("kill {signal}: {e}"),
        )
        .into()
    })
}

/// One fault as the seed draws it; durations in leases.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Draw {
    /// Quiet time before the fault.
    gap: f64,
    kind: FaultKind,
    /// How long the fault lasts.
    hold: f64,
    /// Tie-breaker among candidate victims.
    pick: usize,
}

/// The seeded sequence of faults. Every draw happens whatever the outcome
/// of the faults before, so that a seed always gives the same schedule.
struct Schedule {
    rng: StdRng,
    kinds: Vec<FaultKind>,
}

impl Schedule {
    fn new(seed: u64, kinds: Vec<FaultKind>) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            kinds,
        }
    }
}

impl Iterator for Schedule {
    type Item = Draw;
    fn next(&mut self) -> Option<Draw> {
        if self.kinds.is_empty() {
            return None;
        }
        Some(Draw {
            gap: self.rng.gen_range(1.0..2.0),
            kind: self.kinds[self.rng.gen_range(0..self.kinds.len())],
            hold: self.rng.gen_range(1.5..3.0),
            pick: self.rng.gen(),
        })
    }
}

/// The schedule and its state.
pub struct Nemesis {
    schedule: Schedule,
    lease: Duration,
    end: Instant,
    targets: Arc<Targets>,
    out: Output,
    injected: u64,
}

impl Nemesis {
    /// A nemesis choosing among `kinds` until `end`; `lease` is the lease
    /// the backend actually grants (etcd rounds up to whole seconds).
    pub fn new(
        seed: u64,
        kinds: Vec<FaultKind>,
        lease: Duration,
        end: Instant,
        targets: Arc<Targets>,
        out: Output,
    ) -> Self {
        Self {
            schedule: Schedule::new(seed, kinds),
            lease,
            end,
            targets,
            out,
            injected: 0,
        }
    }

    /// Runs until the end; every fault is undone when this returns `Ok`.
    pub async fn run(mut self) -> Result<(), Error> {
        // Let the workers get going first.
        if !self.sleep(self.lease).await {
            return Ok(());
        }
        while let Some(draw) = self.schedule.next() {
            if !self.sleep(self.lease.mul_f64(draw.gap)).await {
                return Ok(());
            }
            self.inject(draw.kind, self.lease.mul_f64(draw.hold), draw.pick)
                .await?;
            if !self.recovered().await? {
                return Ok(());
            }
        }
        tokio::time::sleep_until(self.end).await;
        Ok(())
    }

    /// Sleeps `d` or until the end; false when the end came first.
    async fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        tokio::time::sleep_until(until.min(self.end)).await;
        until <= self.end
    }

    /// Waits until a write is admitted after the fault (true), or the end
    /// (false): faults are spaced so that the system recovers in between.
    async fn recovered(&self) -> Result<bool, Error> {
        let before = self.targets.store.call(|s| s.admitted_writes()).await?;
        loop {
            if Instant::now() >= self.end {
                return Ok(false);
            }
            if self.targets.store.call(|s| s.admitted_writes()).await? > before {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn inject(&mut self, kind: FaultKind, hold: Duration, pick: usize) -> Result<(), Error> {
        let started = now_us();
        let t = &self.targets;
        let victim = match kind {
            FaultKind::Pause | FaultKind::Partition | FaultKind::Latency | FaultKind::Isolate => {
                Some(self.victim(pick).await?)
            }
            FaultKind::Reset => Some(pick % t.pids.len()),
            FaultKind::Restart | FaultKind::Leader | FaultKind::Reshard => None,
        };
        let mut what = match victim {
            Some(w) => format!("{} worker {w}", kind.name()),
            None => kind.name().to_owned(),
        };
        match kind {
            FaultKind::Pause => {
                let pid = t.pids[victim.unwrap_or(0)];
                signal(pid, Signal::SIGSTOP)?;
                self.sleep(hold).await;
                signal(pid, Signal::SIGCONT)?;
            }
            FaultKind::Partition => {
                let proxy = &t.proxies[victim.unwrap_or(0)];
                proxy.partition();
                self.sleep(hold).await;
                proxy.heal();
            }
            FaultKind::Latency => {
                let proxy = &t.proxies[victim.unwrap_or(0)];
                let base = self.lease / 10;
                proxy.set_latency(Direction::Both, base, base * 2);
                self.sleep(hold).await;
                proxy.heal();
            }
            FaultKind::Reset => t.proxies[victim.unwrap_or(0)].reset_all(),
            FaultKind::Isolate => {
                let (lab, sites) = t.lab.as_ref().ok_or_else(|| {
                    Error::InvalidArgument("isolating a site needs a lab (--topology)".into())
                })?;
                let site = sites[victim.unwrap_or(0) % sites.len()];
                let name = &lab.topology().sites()[site];
                what = format!("isolate {name} (worker {})", victim.unwrap_or(0));
                lab.isolate(site);
                self.sleep(hold).await;
                lab.heal();
            }
            FaultKind::Restart => {
                let server = t.server.as_ref().ok_or_else(no_server)?;
                with_server(server, Server::crash).await?;
                self.sleep(hold / 2).await;
                with_server(server, Server::start_again).await?;
            }
            FaultKind::Leader => {
                let server = t.server.as_ref().ok_or_else(no_server)?;
                let leader = self.kill_leader(server).await?;
                let Some(leader) = leader else {
                    self.out.note("no leader to kill within 10 s; skipped");
                    return Ok(());
                };
                what = format!("leader (member {leader})");
                self.sleep(hold).await;
                with_server(server, Server::start_again).await?;
            }
            FaultKind::Reshard => {
                let server = t.server.as_ref().ok_or_else(no_server)?;
                let epoch = with_server(server, Server::reshard).await?;
                what = format!("reshard to epoch {epoch}");
                if !self.reopened(epoch).await? {
                    return Ok(());
                }
                // A lease whose release failed lives on for up to a lease;
                // only then has nothing of the step before this one a
                // holder, and the next step may come.
                self.sleep(self.lease).await;
            }
        }
        let ended = now_us();
        self.injected += 1;
        self.out.note(format_args!(
            "fault {}: {what} for {:.1}s",
            self.injected,
            (ended - started) as f64 / 1e6
        ));
        let event = Event::new(Kind::Fault, victim.map(|v| v as u32), None, ended)
            .started(started)
            .detail(kind.name());
        t.store.record(vec![event]).await
    }

    /// Waits until every worker has reopened its backend on the map of
    /// `epoch` (true), or the end (false).
    async fn reopened(&self, epoch: u64) -> Result<bool, Error> {
        let workers = self.targets.pids.len();
        loop {
            let epochs = self.targets.store.call(|s| s.map_epochs()).await?;
            let behind = (0..workers)
                .filter(|w| epochs.get(&(*w as u32)).is_none_or(|e| *e < epoch))
                .count();
            if behind == 0 {
                return Ok(true);
            }
            if Instant::now() >= self.end {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the leader once one is known, polling through elections for at
    /// most 10 s.
    async fn kill_leader(&self, server: &SharedServer) -> Result<Option<usize>, Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let key = self.targets.key.clone();
            if let Some(i) = with_server(server, move |s| s.kill_leader(&key)).await? {
                return Ok(Some(i));
            }
            if Instant::now() >= deadline.min(self.end) {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The worker to hit: one between its read and its write (waiting up to
    /// twice the lease for one), else the holder, else `pick`.
    async fn victim(&self, pick: usize) -> Result<usize, Error> {
        let t = &self.targets;
        let n = t.pids.len();
        let deadline = Instant::now() + self.lease * 2;
        while Instant::now() < deadline.min(self.end) {
            let working = t.store.call(|s| s.workers_between_read_and_write()).await?;
            if !working.is_empty() {
                return Ok(working[pick % working.len()] as usize % n);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let holder = tokio::time::timeout(self.lease / 2, t.direct.inspect(&t.key)).await;
        if let Ok(Ok(Some(info))) = holder {
            if let Some(w) = worker_of(info.owner.as_str()).filter(|&w| w < n) {
                return Ok(w);
            }
        }
        Ok(pick % n)
    }
}

fn no_server() -> Error {
    Error::InvalidArgument("this fault needs a server the harness started".into())
}

/// The worker number in an owner name `torture-w{N}-{pid}`.
pub fn worker_of(owner: &str) -> Option<usize> {
    owner
        .strip_prefix("torture-w")?
        .split_once('-')?
        .0
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_drawing_every_kind() {
        use FaultKind::*;
        let kinds = vec![
            Pause, Partition, Latency, Reset, Restart, Leader, Reshard, Isolate,
        ];
        let a: Vec<Draw> = Schedule::new(7, kinds.clone()).take(200).collect();
        let b: Vec<Draw> = Schedule::new(7, kinds.clone()).take(200).collect();
        let c: Vec<Draw> = Schedule::new(8, kinds.clone()).take(200).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        for kind in kinds {
            assert!(a.iter().any(|d| d.kind == kind), "{kind:?} never drawn");
        }
        for d in &a {
            assert!((1.0..2.0).contains(&d.gap) && (1.5..3.0).contains(&d.hold));
        }
        assert_eq!(Schedule::new(7, Vec::new()).next(), None);
    }

    #[test]
    fn worker_numbers_from_owner_names() {
        assert_eq!(worker_of("torture-w3-1234"), Some(3));
        assert_eq!(worker_of("torture-w12-1"), Some(12));
        assert_eq!(worker_of("host:1:abc"), None);
        assert_eq!(worker_of("torture-wx-1"), None);
    }
}
