//! `fencelock torture`: worker processes increment fenced counters under a
//! coordination primitive (the lock, a semaphore, a read-write lock, an
//! election, multi-key locks: `workload`) while a nemesis pauses them, cuts
//! them off, slows them down and crashes the lock server; a checker then
//! reads the recorded history for stale writes, lost updates, token
//! regressions and the workload's own violations.
//!
//! - `workload`: what the workers take and which counters it fences;
//! - `worker`: the worker loop (a process of its own);
//! - `history`: the fenced store and its event table;
//! - `nemesis`: the fault schedule and the faults;
//! - `checker`: the verdict, a pure function over the history;
//! - `report`: JSON and human output;
//! - `export`: the history for an outside linearizability checker.
//!
//! See `docs/safety.md` for what the runs show per backend.

mod checker;
mod export;
mod history;
mod nemesis;
mod report;
mod shards;
mod worker;
mod workload;

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use clap::{Args, ValueEnum};
use fencelock::{redact_url, Error, LockClient, Owner};
use fencelock_testkit::{
    proxy::ProxiedUrl,
    servers::{
        etcd::EtcdCluster, mariadb::MariaDbServer, postgres::PostgresServer, redis::RedisServer,
        redis_cluster::RedisCluster, redis_sentinel::RedisSentinel, redis_set::RedisSet,
        zookeeper::ZkServer,
    },
    TestResult,
};
use tokio::{process::Child, time::Instant};

pub use self::worker::WorkerArgs;
use self::{
    history::{now_us, SharedStore, Store},
    nemesis::{FaultKind, Nemesis, Server, SharedServer, Targets},
    report::{Config, Report},
    workload::{multi_key, Workload},
};
use crate::{
    topology::{self, Lab, LabEngine},
    Output, Verdict,
};

/// `fencelock torture`'s arguments.
#[derive(Debug, Args)]
pub struct TortureArgs {
    /// Start a throwaway server from the binaries on PATH instead of using
    /// --url (etcd-cluster, zookeeper-cluster: 3 members; redis-cluster: 3
    /// primaries and 3 replicas; redis-sentinel: a master, a replica and 3
    /// Sentinels; for leader kills).
    #[arg(long, value_enum)]
    pub server: Option<ServerKind>,

    /// Worker processes competing for the lock.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub workers: u32,

    /// How long the workers run.
    #[arg(long, default_value = "60s", value_parser = fencelock::parse_duration)]
    pub duration: Duration,

    /// The workers' lease length (auto-renewed every third of it).
    #[arg(long, default_value = "2s", value_parser = crate::ttl)]
    pub ttl: Duration,

    /// Faults to inject, comma-separated [default: every fault that applies
    /// to the backend: pause on SQLite; pause, partition, latency and reset
    /// on servers (not on a Redis Cluster or Sentinel set, whose clients
    /// bypass the proxies); restart on servers the harness started; leader
    /// on etcd-cluster, zookeeper-cluster, redis-cluster and redis-sentinel;
    /// pause and reshard on sharded; in a lab (--topology) the workers'
    /// faults and isolate, which cuts a site off].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,

    /// Seed of the fault schedule [default: random, printed].
    #[arg(long)]
    pub seed: Option<u64>,

    /// Write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Write the history as operations on the fenced counters and grants
    /// (JSON), for the outside checker of crates/fencelock-lab/porcupine
    /// (not for --workload rwlock).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,

    /// Skip the fence (plain read-modify-write): shows what the faults do
    /// without it.
    #[arg(long)]
    pub unfenced: bool,

    /// The lock's key.
    #[arg(long, default_value = "fencelock-torture")]
    pub key: String,

    /// Keep the fenced store and its history in this new SQLite file
    /// [default: a temporary file, deleted afterwards].
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,

    /// The primitive the workers take: lock, semaphore (one counter per
    /// permit), rwlock (readers and writers), election (the term as token),
    /// multi (2–3 of 4 keys, a counter per key).
    #[arg(long, value_enum, default_value_t)]
    pub workload: Workload,

    /// The semaphore's permits (--workload semaphore).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=i64::from(fencelock::MAX_PERMITS)))]
    pub permits: u32,

    /// Run in a lab instead: start --engine's servers in the sites of this
    /// topology file, every link between two sites delayed as it says
    /// (docs/multi-dc.md), and spread the workers over its client sites in
    /// turn; the `isolate` fault cuts a site off.
    #[arg(long, requires = "engine", conflicts_with = "server")]
    pub topology: Option<PathBuf>,

    /// The engine the lab places in the topology's sites.
    #[arg(long, value_enum, requires = "topology")]
    pub engine: Option<LabEngine>,
}

/// Servers `--server` can start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServerKind {
    /// PostgreSQL (`initdb`, `postgres`).
    Postgres,
    /// MariaDB (`mariadb-install-db`, `mariadbd`).
    Mariadb,
    /// Redis without persistence (`redis-server`).
    Redis,
    /// A Redis Cluster of three primaries and three replicas, without
    /// persistence.
    RedisCluster,
    /// A master and a replica watched by three Sentinels, without
    /// persistence: `leader` kills -9 the master, which the Sentinels fail
    /// over to the replica.
    RedisSentinel,
    /// Three independent Redis servers without persistence, as a
    /// `redlock://` set: `restart` kills -9 one node and starts it again
    /// empty at once (round robin), `leader` pauses the first node (every
    /// race's arbiter) as a partition from everyone would.
    Redlock,
    /// One etcd member.
    Etcd,
    /// Three etcd members.
    EtcdCluster,
    /// One standalone ZooKeeper server.
    Zookeeper,
    /// A ZooKeeper ensemble of three.
    ZookeeperCluster,
    /// A SQLite file in the run's temporary directory.
    Sqlite,
    /// A shard map over two SQLite files that the `reshard` fault steps
    /// through a transition, moving the key between the shards and back.
    Sharded,
    /// The lock service as it runs in production: three `fencelock serve`
    /// replicas (this binary) over one Redis with persistence, behind
    /// HAProxy; the workers go through the balancer, and `restart` kills -9
    /// one replica (round robin) and starts it again.
    Replicas,
}

impl ServerKind {
    fn name(self) -> &'static str {
        match self {
            ServerKind::Postgres => "postgres",
            ServerKind::Mariadb => "mariadb",
            ServerKind::Redis => "redis",
            ServerKind::RedisCluster => "redis-cluster",
            ServerKind::RedisSentinel => "redis-sentinel",
            ServerKind::Redlock => "redlock",
            ServerKind::Etcd => "etcd",
            ServerKind::EtcdCluster => "etcd-cluster",
            ServerKind::Zookeeper => "zookeeper",
            ServerKind::ZookeeperCluster => "zookeeper-cluster",
            ServerKind::Sqlite => "sqlite",
            ServerKind::Sharded => "sharded",
            ServerKind::Replicas => "replicas",
        }
    }

    /// Starts the server; a shard map is laid out so that `key` moves.
    fn start(self, key: &str) -> TestResult<Option<Server>> {
        Ok(Some(match self {
            ServerKind::Postgres => Server::Postgres(PostgresServer::start()?),
            ServerKind::Mariadb => Server::MariaDb(MariaDbServer::start()?),
            ServerKind::Redis => Server::Redis(RedisServer::start()?),
            ServerKind::RedisCluster => Server::RedisCluster(RedisCluster::start()?),
            ServerKind::RedisSentinel => Server::RedisSentinel(RedisSentinel::start()?),
            ServerKind::Redlock => Server::Redlock(RedisSet::start(3)?, 0),
            ServerKind::Etcd => Server::Etcd(EtcdCluster::start()?),
            ServerKind::EtcdCluster => Server::Etcd(EtcdCluster::start_members(3)?),
            ServerKind::Zookeeper => Server::Zookeeper(ZkServer::start()?),
            ServerKind::ZookeeperCluster => Server::Zookeeper(ZkServer::start_members(3)?),
            ServerKind::Sharded => Server::Sharded(shards::ShardSteps::start(key)?),
            ServerKind::Replicas => Server::Replicas(nemesis::ServiceReplicas::start()?),
            ServerKind::Sqlite => return Ok(None),
        }))
    }
}

/// The faults that apply: SQLite is a file (no network, nothing to crash
/// but the workers themselves); a server can be cut off; one the harness
/// started can be crashed; a cluster has a leader; the harness's shard map
/// can be stepped (a map given by URL only paused: its shards' traffic
/// does not go through one proxy); a lab's site can be cut off.
fn applicable(engine: &str, server: Option<ServerKind>, lab: bool) -> Vec<FaultKind> {
    use FaultKind::*;
    // The lab's servers are its own: its faults are the workers' and a
    // site's.
    if lab {
        return vec![Pause, Partition, Latency, Reset, Isolate];
    }
    if server == Some(ServerKind::Sharded) {
        return vec![Pause, Reshard];
    }
    if engine == "sqlite" || engine == "sharded" {
        return vec![Pause];
    }
    // A Redis Cluster or Sentinel client connects to the nodes it
    // discovers, not to the proxy in front of the URL's: no network faults
    // there.
    let mut kinds = if engine == "redis-cluster" || engine == "redis-sentinel" {
        vec![Pause]
    } else {
        vec![Pause, Partition, Latency, Reset]
    };
    if server.is_some() {
        kinds.push(Restart);
    }
    if matches!(
        server,
        Some(
            ServerKind::EtcdCluster
                | ServerKind::ZookeeperCluster
                | ServerKind::RedisCluster
                | ServerKind::RedisSentinel
                | ServerKind::Redlock
        )
    ) {
        kinds.push(Leader);
    }
    kinds
}

fn engine_of(url: &str) -> Result<&'static str, Error> {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    Ok(match scheme.as_str() {
        "sqlite" => "sqlite",
        "postgres" | "postgresql" => "postgres",
        "mysql" | "mariadb" => "mysql",
        "redis" | "rediss" => "redis",
        "redis+cluster" | "rediss+cluster" => "redis-cluster",
        "redis+sentinel" | "rediss+sentinel" => "redis-sentinel",
        "redlock" => "redlock",
        "etcd" => "etcd",
        "zk" => "zookeeper",
        "sharded" => "sharded",
        // A `fencelock serve` service: the faults act on the HTTP
        // connections between the workers and the service.
        "http" | "https" => "http",
        "mem" | "memory" => {
            return Err(Error::InvalidArgument(
                "torture needs a backend shared by processes; mem:// lives in one".into(),
            ))
        }
        _ => {
            return Err(Error::InvalidUrl(format!(
                "{:?}: unknown scheme",
                redact_url(url)
            )))
        }
    })
}

fn harness_error(message: impl Into<String>) -> Error {
    fencelock::BackendError::message("torture", fencelock::ErrorStatus::Permanent, message).into()
}

/// Runs `fencelock torture`; Ctrl-C or SIGTERM stops it, and every worker,
/// proxy and server with it.
///
/// The workers are this same executable re-run as `--quiet torture-worker
/// …` with the URL in `FENCELOCK_URL`: the binary that calls this must send
/// that command to [`run_worker`].
pub async fn run(url: Option<String>, args: TortureArgs, out: Output) -> Result<Verdict, Error> {
    crate::until_interrupted("torture", torture(url, args, out), out).await
}

/// Runs one worker (the hidden `torture-worker` command).
pub async fn run_worker(url: Option<String>, args: WorkerArgs) -> Result<Verdict, Error> {
    let url = url.ok_or_else(|| Error::InvalidUrl("torture-worker needs FENCELOCK_URL".into()))?;
    worker::run(&url, args).await
}

async fn torture(url: Option<String>, args: TortureArgs, out: Output) -> Result<Verdict, Error> {
    let engine = match (&url, args.server) {
        (Some(_), _) if args.topology.is_some() => {
            return Err(Error::InvalidArgument(
                "--topology starts a lab of its own: drop --url (and FENCELOCK_URL)".into(),
            ))
        }
        (None, None) if args.topology.is_some() => args.engine.map_or("lab", |e| e.name()),
        (Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(
                "--server starts a server of its own: drop --url (and FENCELOCK_URL)".into(),
            ))
        }
        (None, None) => {
            return Err(Error::InvalidArgument(
                "torture needs --url URL or --server KIND".into(),
            ))
        }
        (Some(url), None) => engine_of(url)?,
        (None, Some(ServerKind::Sqlite)) => "sqlite",
        (None, Some(ServerKind::Postgres)) => "postgres",
        (None, Some(ServerKind::Mariadb)) => "mysql",
        (None, Some(ServerKind::Redis)) => "redis",
        (None, Some(ServerKind::RedisCluster)) => "redis-cluster",
        (None, Some(ServerKind::RedisSentinel)) => "redis-sentinel",
        (None, Some(ServerKind::Redlock)) => "redlock",
        (None, Some(ServerKind::Etcd | ServerKind::EtcdCluster)) => "etcd",
        (None, Some(ServerKind::Zookeeper | ServerKind::ZookeeperCluster)) => "zookeeper",
        (None, Some(ServerKind::Sharded)) => "sharded",
        (None, Some(ServerKind::Replicas)) => "http",
    };
    let applicable = applicable(engine, args.server, args.topology.is_some());
    let mut faults = if args.faults.is_empty() {
        applicable.clone()
    } else {
        args.faults.clone()
    };
    faults.sort();
    faults.dedup();
    if let Some(bad) = faults.iter().find(|f| !applicable.contains(f)) {
        let why = match bad {
            FaultKind::Restart => "the harness restarts only servers it started (--server)",
            FaultKind::Leader => {
                "leader kills need --server etcd-cluster, zookeeper-cluster, redis-cluster or \
                 redis-sentinel"
            }
            FaultKind::Reshard => "resharding steps the map of --server sharded",
            FaultKind::Isolate => "a site is cut off in a lab (--topology)",
            _ if args.topology.is_some() => "the lab's servers are its own: no restarts or leader kills",
            _ if engine == "sharded" => {
                "a shard map's faults are pauses and (--server sharded) reshards"
            }
            _ if engine == "redis-cluster" => {
                "a Redis Cluster client bypasses the fault proxies (it connects to every node)"
            }
            _ if engine == "redis-sentinel" => {
                "a Sentinel client bypasses the fault proxies (it connects to the master it is told of)"
            }
            _ => "SQLite has no network between the workers and the lock",
        };
        return Err(Error::InvalidArgument(format!(
            "--faults {}: {why}",
            bad.name()
        )));
    }
    fencelock::LockKey::new(args.key.as_str())?;
    if args.history.is_some() && !export::supported(args.workload) {
        return Err(Error::InvalidArgument(format!(
            "--history: the outside checker has no model of --workload {}",
            args.workload.name()
        )));
    }
    if args.workload == Workload::Semaphore && args.permits >= args.workers {
        return Err(Error::InvalidArgument(format!(
            "--permits {} leaves {} workers nothing to wait for: use fewer permits than --workers",
            args.permits, args.workers
        )));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    out.note(format_args!(
        "torture seed {seed} (replay with --seed {seed})"
    ));

    // Dropped last: everything below lives in it.
    let dir = tempfile::Builder::new()
        .prefix("fencelock-torture-")
        .tempdir()
        .map_err(|e| harness_error(format!("cannot create a temporary directory: {e}")))?;
    let store_path = args
        .store
        .clone()
        .unwrap_or_else(|| dir.path().join("store.db"));
    Store::create(&store_path)?;

    let server: Option<SharedServer> = match args.server {
        Some(kind) => {
            match kind {
                ServerKind::Sqlite => out.note(format_args!("using a throwaway sqlite file")),
                ServerKind::Sharded => out.note(format_args!(
                    "using a throwaway shard map over two sqlite files"
                )),
                _ => out.note(format_args!("starting a throwaway {} server", kind.name())),
            }
            let key = args.key.clone();
            tokio::task::spawn_blocking(move || kind.start(&key).map_err(|e| e.to_string()))
                .await
                .map_err(|e| harness_error(e.to_string()))?
                .map_err(|e| harness_error(format!("cannot start the server: {e}")))?
                .map(|s| Arc::new(std::sync::Mutex::new(s)))
        }
        None => None,
    };
    let lab = match (&args.topology, args.engine) {
        (Some(path), Some(engine)) => Some(Arc::new(start_lab(path, engine, args.ttl, out).await?)),
        _ => None,
    };
    // Worker w stands in the lab's client site w mod their number.
    let sites: Vec<usize> = lab.as_ref().map_or_else(Vec::new, |lab| {
        let clients = lab.topology().clients();
        (0..args.workers as usize)
            .map(|w| clients[w % clients.len()])
            .collect()
    });
    let url_of = |w: usize| {
        let lab = lab.as_ref()?;
        lab.url_from(*sites.get(w)?).map(str::to_owned)
    };
    let url = match (&server, url) {
        (_, Some(url)) => url,
        (_, None) if lab.is_some() => {
            url_of(0).ok_or_else(|| harness_error("the lab has no client site"))?
        }
        (Some(server), None) => server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .url(),
        (None, None) => format!("sqlite://{}", dir.path().join("locks.db").display()),
    };

    // One client straight to the backend: it measures the lease the backend
    // grants and finds holders for the nemesis.
    let direct = LockClient::builder(fencelock::open_backend(&url).await?)
        .owner(Owner::new("torture-nemesis")?)
        .build()?;
    if args.workload == Workload::Rwlock && !direct.backend().capabilities().shared {
        return Err(Error::InvalidArgument(format!(
            "--workload rwlock: {} offers no read-write locks",
            redact_url(&url)
        )));
    }
    let probe = direct
        .lock(args.key.as_str())
        .ttl(args.ttl)
        .wait(args.ttl * 3 + Duration::from_secs(30))
        .acquire()
        .await?;
    let lease = probe.granted_ttl().max(args.ttl);
    probe.release().await?;

    // A pause of up to 3 leases inside a store transaction stalls the
    // others that long; they must wait it out, not fail.
    let busy = lease * 3 + Duration::from_secs(30);
    let store = SharedStore::new(Store::open(&store_path, busy, !args.unfenced)?);

    // Each worker's own URL: its site's in a lab.
    let worker_urls: Vec<String> = (0..args.workers as usize)
        .map(|w| url_of(w).unwrap_or_else(|| url.clone()))
        .collect();
    let mut proxies = Vec::new();
    if faults.iter().any(|f| f.needs_proxy()) {
        for worker_url in &worker_urls {
            proxies.push(
                ProxiedUrl::start(worker_url)
                    .await
                    .map_err(|e| harness_error(format!("cannot start a fault proxy: {e}")))?,
            );
        }
    }

    let started = Instant::now();
    let end = started + args.duration;
    let until_us = now_us() + i64::try_from(args.duration.as_micros()).unwrap_or(i64::MAX / 2);
    let mut children = Vec::new();
    for w in 0..args.workers {
        let worker_url = proxies
            .get(w as usize)
            .map_or(worker_urls[w as usize].as_str(), |p| p.url());
        children.push(spawn_worker(
            w,
            worker_url,
            &args,
            &store_path,
            seed,
            until_us,
            busy,
        )?);
    }
    let pids = children
        .iter()
        .map(|c| {
            c.id()
                .ok_or_else(|| harness_error("a worker exited at once"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.note(format_args!(
        "{} workers on {} for {}, lease {}ms, faults: {}",
        args.workers,
        match &lab {
            Some(lab) => format!(
                "{} in the lab (sites {})",
                engine,
                sites
                    .iter()
                    .map(|&s| lab.topology().sites()[s].as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => redact_url(&url),
        },
        humantime::format_duration(args.duration),
        lease.as_millis(),
        names(&faults)
    ));

    // The key whose holder the nemesis may pick as a victim.
    let holder_key = match args.workload {
        Workload::Lock | Workload::Rwlock => args.key.clone(),
        Workload::Semaphore => fencelock::semaphore_slot_key(&args.key, 0),
        Workload::Election => direct.election(args.key.as_str()).key(),
        Workload::Multi => multi_key(&args.key, 0),
    };
    let targets = Arc::new(Targets {
        pids,
        proxies,
        server,
        direct,
        key: holder_key,
        store: store.clone(),
        lab: lab.clone().map(|lab| (lab, sites.clone())),
    });
    let nemesis = Nemesis::new(seed, faults.clone(), lease, end, Arc::clone(&targets), out).run();
    tokio::pin!(nemesis);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            result = &mut nemesis => {
                targets.calm();
                result?;
                break;
            }
            _ = tick.tick() => failed_worker(&mut children)?,
        }
    }
    // A worker finishes the round it is in: at most a lease-long wait, work
    // of up to 1.5 leases, and calls bounded by a lease each.
    let bound = lease * 8 + Duration::from_secs(30);
    tokio::time::timeout(bound, async {
        for child in &mut children {
            let _ = child.wait().await;
        }
    })
    .await
    .map_err(|_| harness_error(format!("workers still running {bound:?} after the end")))?;
    failed_worker(&mut children)?;
    let elapsed = started.elapsed();

    let (events, counters) = store.call(|s| Ok((s.events()?, s.counters()?))).await?;
    let spec = checker::Spec {
        workload: args.workload,
        permits: args.permits,
    };
    let results = checker::check(spec, &events, &counters);
    if let Some(path) = &args.history {
        let history = export::export(args.workload, args.unfenced, &events, &counters, &results);
        let json = serde_json::to_string(&history)
            .map_err(|e| harness_error(format!("cannot encode the history: {e}")))?;
        std::fs::write(path, json + "\n").map_err(|e| {
            harness_error(format!(
                "cannot write the history to {}: {e}",
                path.display()
            ))
        })?;
    }
    let report = Report::new(
        Config {
            backend: engine.to_owned(),
            url: (args.server.is_none() && lab.is_none()).then(|| redact_url(&url)),
            server: args.server.map(|s| s.name().to_owned()),
            topology: args.topology.as_ref().map(|p| p.display().to_string()),
            workers: args.workers,
            duration_s: args.duration.as_secs_f64(),
            ttl_ms: u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            faults,
            seed,
            unfenced: args.unfenced,
            key: args.key.clone(),
            workload: args.workload,
            permits: (args.workload == Workload::Semaphore).then_some(args.permits),
        },
        elapsed.as_secs_f64(),
        results,
    );
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| harness_error(format!("cannot encode the report: {e}")))?;
        std::fs::write(path, json + "\n").map_err(|e| {
            harness_error(format!(
                "cannot write the report to {}: {e}",
                path.display()
            ))
        })?;
    }
    out.emit(&report, || report.summary());
    if report.results.writes_admitted == 0 {
        return Err(harness_error(
            "no write was admitted: the run shows nothing (is the backend reachable?)",
        ));
    }
    Ok(if report.violations > 0 {
        Verdict::Violation
    } else {
        Verdict::Passed
    })
}

/// Starts the lab of `--topology` and `--engine`, noting a lease too short
/// to outlast the engine's failover across it.
async fn start_lab(
    path: &std::path::Path,
    engine: LabEngine,
    lease: Duration,
    out: Output,
) -> Result<Lab, Error> {
    let lab = topology::start(path, engine, out).await?;
    let failover = engine.failover(lab.topology().longest_rtt());
    if lease < failover * 3 {
        // Not an error: a short lease shows what it costs.
        out.note(format_args!(
            "a lease of {lease:?} is below three failovers of {} across the lab ({:?}): \
             isolating a site may cost holders elsewhere their locks",
            engine.name(),
            failover * 3
        ));
    }
    Ok(lab)
}

fn names(faults: &[FaultKind]) -> String {
    if faults.is_empty() {
        return "none".into();
    }
    faults
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(",")
}

fn spawn_worker(
    w: u32,
    url: &str,
    args: &TortureArgs,
    store: &std::path::Path,
    seed: u64,
    until_us: i64,
    busy: Duration,
) -> Result<Child, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| harness_error(format!("cannot find the fencelock binary: {e}")))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--quiet")
        .arg("torture-worker")
        .arg("--store")
        .arg(store)
        .args(["--worker", &w.to_string()])
        .args(["--key", &args.key])
        .args(["--workload", args.workload.name()])
        .args(["--permits", &args.permits.to_string()])
        .args(["--ttl", &format!("{}ms", args.ttl.as_millis())])
        .args([
            "--seed",
            &seed
                .wrapping_add(u64::from(w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .to_string(),
        ])
        .args(["--until-us", &until_us.to_string()])
        .args(["--busy", &format!("{}ms", busy.as_millis())])
        .args(["--parent", &std::process::id().to_string()])
        // The URL goes by environment: a password in argv shows in `ps`.
        .env("FENCELOCK_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // A run that ends early or is interrupted takes its workers along.
        .kill_on_drop(true);
    if args.unfenced {
        cmd.arg("--unfenced");
    }
    cmd.spawn()
        .map_err(|e| harness_error(format!("cannot start worker {w}: {e}")))
}

/// An error naming the first worker that exited with a failure.
fn failed_worker(children: &mut [Child]) -> Result<(), Error> {
    for (w, child) in children.iter_mut().enumerate() {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| harness_error(format!("worker {w}: {e}")))?
        {
            if !status.success() {
                return Err(harness_error(format!(
                    "worker {w} failed ({status}); see its error above"
                )));
            }
        }
    }
    Ok(())
}
