//! `fencelock scorecard`: what one sick component of a healthy majority
//! costs the clients that were willing to wait.
//!
//! For each deployment shape it starts throwaway servers, then runs one case
//! per fault: holders keep locks whose lease is three times the shape's
//! failover time, waiters queue behind two of them with a wait that covers
//! the failover, and a new caller every 200 ms opens a backend of
//! its own and takes a fresh key (its wait covers the failover too). One
//! component is then failed — killed with SIGKILL, stopped with SIGSTOP
//! and continued three failover times later, or (asked for by name) killed
//! and started again at once, without its data where the shape keeps none
//! on disk, or cut off from its clients by a silent network for three
//! failover times, or killed and started again without its data — and the
//! case counts:
//!
//! - **unnecessary losses**: holders that lost their lock, although a
//!   majority (or the failover target) stayed healthy;
//! - **failed calls**: callers and waiters whose call ended with anything
//!   but a grant, although their wait covered the failover;
//! - **the window**: the longest stretch, after the fault, in which no new
//!   caller was granted anything;
//! - **recovery**: from the fault to the first grant of a caller that
//!   started after it;
//! - **safety**: every waiter's token above the holder's before it.
//!
//! A figure is a measurement, never a pass mark: the command reports and
//! asserts nothing but safety (docs/faults.md, "Scorecard").

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use clap::{Args, ValueEnum};
use fencelock::{Error, LockClient, LockGuard, Owner};
use fencelock_testkit::{
    proxy::{endpoints, with_endpoints, FaultProxy},
    servers::{
        etcd::EtcdCluster,
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
use serde::Serialize;
use tokio::time::Instant;

use crate::{
    topology::{self, Lab, LabEngine},
    Output, Verdict,
};

/// How often a new caller starts.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// A stopped component stays stopped this many failover times.
const STOP_FOR: u32 = 3;
/// Holders per case; waiters queue behind the first [`WAITERS`].
const HOLDERS: usize = 4;
const WAITERS: usize = 2;

/// `fencelock scorecard`'s arguments.
#[derive(Debug, Args)]
pub struct ScorecardArgs {
    /// Deployment shapes to score, comma-separated [default: every shape].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub shapes: Vec<Shape>,

    /// Faults to inject, comma-separated [default: kill,stop].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,

    /// Score a site partition instead: start --engine in the sites of this
    /// topology file and cut --isolate off from the others for twice the
    /// TTL (docs/multi-dc.md).
    #[arg(
        long,
        requires_all = ["engine", "isolate"],
        conflicts_with_all = ["shapes", "faults"]
    )]
    pub topology: Option<PathBuf>,

    /// The engine the lab places in the topology's sites.
    #[arg(long, value_enum, requires = "topology")]
    pub engine: Option<LabEngine>,

    /// The site the partition cuts off.
    #[arg(long, requires = "topology")]
    pub isolate: Option<String>,

    /// The holders' lease [default: in a partition, three times the
    /// engine's failover time across the topology's longest round trip;
    /// for a shape, three times its failover time, at least 3 s]. A
    /// shape's holders never get less than three failover times, the
    /// lease a single fault must cost nothing at; a longer one suits a
    /// busy machine.
    #[arg(long, value_parser = crate::ttl)]
    pub ttl: Option<Duration>,
}

/// A deployment shape: what is started, and its failover time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// Three `fencelock serve` replicas over Redis, the client given every
    /// address (`http://h1,h2,h3`); one replica fails.
    Replicas,
    /// The same replicas behind HAProxy; one replica fails.
    ReplicasHaproxy,
    /// A master, a replica and three Sentinels; the master fails.
    RedisSentinel,
    /// A Redis Cluster of three primaries, each with a replica; the primary
    /// of the first holder's key fails.
    RedisCluster,
    /// Three independent Redis nodes (`redlock://`); the first fails.
    Redlock,
    /// Five independent Redis nodes; the first fails.
    #[value(name = "redlock-5")]
    #[serde(rename = "redlock-5")]
    Redlock5,
    /// Three etcd members; the leader fails.
    Etcd,
    /// Three ZooKeeper members; the leader fails.
    Zookeeper,
    /// One PostgreSQL server, crashed and started again (its only fault:
    /// one server has no majority to carry on without it).
    Postgres,
}

impl Shape {
    const ALL: [Shape; 9] = [
        Shape::Replicas,
        Shape::ReplicasHaproxy,
        Shape::RedisSentinel,
        Shape::RedisCluster,
        Shape::Redlock,
        Shape::Redlock5,
        Shape::Etcd,
        Shape::Zookeeper,
        Shape::Postgres,
    ];

    fn name(self) -> &'static str {
        match self {
            Shape::Replicas => "replicas",
            Shape::ReplicasHaproxy => "replicas-haproxy",
            Shape::RedisSentinel => "redis-sentinel",
            Shape::RedisCluster => "redis-cluster",
            Shape::Redlock => "redlock",
            Shape::Redlock5 => "redlock-5",
            Shape::Etcd => "etcd",
            Shape::Zookeeper => "zookeeper",
            Shape::Postgres => "postgres",
        }
    }

    /// Why `fault` is not a case of this shape, if it is not.
    fn refuses(self, fault: Fault) -> Option<&'static str> {
        match (self, fault) {
            (Shape::RedisSentinel, Fault::Restart) => {
                Some("the Sentinels bring a failed master back as a replica")
            }
            (Shape::RedisSentinel | Shape::RedisCluster, Fault::Silent) => {
                Some("clients reach the servers the Sentinels or the cluster name, past any proxy")
            }
            (Shape::Postgres, Fault::Kill | Fault::Stop | Fault::Silent | Fault::Wipe) => {
                Some("one server: without it there is no majority to carry on")
            }
            (Shape::Etcd | Shape::Zookeeper, Fault::Wipe) => None,
            (Shape::Redlock | Shape::Redlock5, Fault::Wipe) => {
                Some("its restart already comes back without data")
            }
            (_, Fault::Wipe) => Some("no member of a quorum keeps data to lose"),
            _ => None,
        }
    }

    /// The shape's documented failover time for `fault`: how long the
    /// healthy majority needs to carry on without the failed component.
    fn failover(self, fault: Fault) -> Duration {
        match self {
            // The client's replica_timeout (docs/http.md).
            Shape::Replicas => Duration::from_secs(1),
            // A killed replica refuses at once. A stopped one stays in the
            // balancer until two checks of `timeout check 3s` fail
            // (deploy/haproxy.cfg), but the client does not wait for that:
            // a request that may be sent twice goes again after
            // `replica_timeout`, and the balancer hands the copy to another
            // replica.
            Shape::ReplicasHaproxy => Duration::from_secs(1),
            // down-after-milliseconds 1000, then the Sentinels' election.
            Shape::RedisSentinel => Duration::from_secs(3),
            // cluster-node-timeout 1000 (the test kit's), then the replica's
            // election; a restarted primary is back sooner.
            Shape::RedisCluster => Duration::from_secs(3),
            // A crash, its recovery, and the pool's new connections.
            Shape::Postgres => Duration::from_secs(3),
            // No failover: a majority answers; a dead node costs its
            // node_timeout (250 ms) at most.
            Shape::Redlock | Shape::Redlock5 => Duration::from_secs(1),
            // The test kit's election timeout, then a new leader.
            Shape::Etcd => Duration::from_secs(2),
            // A killed leader's followers see its connections close and
            // elect at once; a silent one they give up on only after
            // `syncLimit` ticks (the test kit's 5 × 2 s, ZooKeeper's sample
            // configuration), and only then elect. Then the sessions
            // reconnect (docs/zookeeper.md, "Failover").
            // A member silent to its clients only stays in the ensemble;
            // a session gives up on it after two thirds of its timeout and
            // moves to another member, as from a stopped one.
            Shape::Zookeeper => match fault {
                Fault::Kill | Fault::Restart | Fault::Wipe => Duration::from_secs(4),
                Fault::Stop | Fault::Silent => Duration::from_secs(13),
            },
        }
    }
}

/// How the component fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL; it stays dead for the rest of the case.
    Kill,
    /// SIGSTOP (it accepts connections and answers nothing), SIGCONT
    /// three failover times later.
    Stop,
    /// SIGKILL, then started again at once on the same ports: a crash and
    /// a restart. Redis nodes keep nothing on disk here, so a Redlock node
    /// comes back empty; a Redis Cluster primary, etcd and ZooKeeper
    /// members and PostgreSQL keep their data, and a replica has none. Not
    /// offered for `redis-sentinel` (its failed master is the Sentinels' to
    /// bring back as a replica).
    Restart,
    /// The network between the clients and the component swallows every
    /// byte both ways, connections left open, for three failover times,
    /// then heals (the test kit's fault proxy in front of each endpoint).
    /// The component's peers still see it: an etcd or ZooKeeper leader
    /// keeps leading. Not offered where clients connect to the servers a
    /// cluster names (`redis-sentinel`, `redis-cluster`).
    Silent,
    /// SIGKILL, the member's data deleted, then started again at once on
    /// its ports and with its identity: a restart without data, as after
    /// a lost disk. Offered for `etcd` and `zookeeper` (a Redlock node's
    /// `restart` is already without data; replicas keep none).
    Wipe,
}

/// The servers of one shape, the URL the clients use, and the component
/// the case fails.
struct Deployment {
    servers: Servers,
    url: String,
    /// With [`Fault::Silent`], one fault proxy in front of each of the
    /// clients' endpoints, in the order of the servers' own (behind
    /// HAProxy: between the balancer and each replica).
    proxies: Vec<FaultProxy>,
    /// What failed, once it has.
    failed: Option<Victim>,
}

/// The failed component: a replica or member (and its proxy) by index, or
/// a Redis server by port.
#[derive(Clone, Copy)]
enum Victim {
    Index(usize),
    Port(u16),
}

enum Servers {
    Replicas {
        replicas: ServeReplicas,
        _balancer: Option<Haproxy>,
        _redis: RedisServer,
    },
    Sentinel(RedisSentinel),
    Cluster {
        cluster: RedisCluster,
        /// The first holder's key: its primary fails.
        hot: String,
    },
    Members(Members),
    Postgres(PostgresServer),
}

/// The member sets that fail one member alike.
enum Members {
    Redlock(RedisSet),
    Etcd(EtcdCluster),
    Zookeeper(ZkServer),
}

impl Deployment {
    /// Starts `shape`'s servers; with [`Fault::Silent`], behind fault
    /// proxies. `hot` is the first holder's key.
    async fn start(shape: Shape, fault: Fault, hot: &str) -> TestResult<Self> {
        let silent = fault == Fault::Silent;
        let hot = hot.to_owned();
        let (servers, url, proxies) = match shape {
            Shape::Replicas | Shape::ReplicasHaproxy => {
                let (redis, replicas) = tokio::task::spawn_blocking(|| {
                    let redis = RedisServer::start_persistent()?;
                    let binary = std::env::current_exe()?;
                    let replicas = ServeReplicas::start(&binary, &redis.url(), 3, &[])?;
                    TestResult::Ok((redis, replicas))
                })
                .await??;
                let (url, proxies) = behind_proxies(&replicas.url_of_all(), silent).await?;
                let (url, balancer) = if shape == Shape::ReplicasHaproxy {
                    // The balancer's backends are the replicas, or their
                    // proxies: the client keeps its one address.
                    let ports: Vec<u16> = endpoints(&url)?.iter().map(|a| a.port()).collect();
                    let balancer =
                        tokio::task::spawn_blocking(move || Haproxy::start(&ports)).await??;
                    (balancer.url(), Some(balancer))
                } else {
                    (url, None)
                };
                let servers = Servers::Replicas {
                    replicas,
                    _balancer: balancer,
                    _redis: redis,
                };
                (servers, url, proxies)
            }
            Shape::RedisSentinel => {
                let set = tokio::task::spawn_blocking(RedisSentinel::start).await??;
                let url = set.url();
                (Servers::Sentinel(set), url, Vec::new())
            }
            Shape::RedisCluster => {
                let cluster = tokio::task::spawn_blocking(RedisCluster::start_persistent).await??;
                let url = cluster.url();
                (Servers::Cluster { cluster, hot }, url, Vec::new())
            }
            Shape::Postgres => {
                let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
                let url = server.url("postgres");
                (Servers::Postgres(server), url, Vec::new())
            }
            Shape::Redlock | Shape::Redlock5 | Shape::Etcd | Shape::Zookeeper => {
                let members = tokio::task::spawn_blocking(move || Members::start(shape)).await??;
                let (url, proxies) = behind_proxies(&members.control().url(), silent).await?;
                (Servers::Members(members), url, proxies)
            }
        };
        Ok(Deployment {
            servers,
            url,
            proxies,
            failed: None,
        })
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    /// Fails the shape's component; answers which one.
    fn fail(&mut self, fault: Fault) -> TestResult<String> {
        let (victim, component) = match &mut self.servers {
            Servers::Replicas { replicas, .. } => {
                match fault {
                    Fault::Kill => replicas.kill(0)?,
                    Fault::Stop => replicas.pause(0)?,
                    Fault::Restart => {
                        replicas.kill(0)?;
                        replicas.start_again(0)?;
                    }
                    Fault::Silent => silence(&self.proxies, 0)?,
                    Fault::Wipe => return not_offered(fault),
                }
                (Victim::Index(0), "replica 0".to_owned())
            }
            Servers::Sentinel(set) => {
                let master = set.master_port()?;
                match fault {
                    Fault::Kill => set.kill(master)?,
                    Fault::Stop => set.pause(master)?,
                    Fault::Restart | Fault::Silent | Fault::Wipe => return not_offered(fault),
                }
                (Victim::Port(master), format!("master {master}"))
            }
            Servers::Cluster { cluster, hot } => {
                let slot = cluster.keyslot(&format!("{{{hot}}}"))?;
                let primary = cluster.primary_of(slot)?;
                match fault {
                    Fault::Kill => cluster.kill(primary)?,
                    Fault::Stop => cluster.pause(primary)?,
                    Fault::Restart => {
                        cluster.kill(primary)?;
                        cluster.start_again(primary)?;
                    }
                    Fault::Silent | Fault::Wipe => return not_offered(fault),
                }
                (Victim::Port(primary), format!("primary {primary}"))
            }
            Servers::Postgres(server) => {
                if fault != Fault::Restart {
                    return not_offered(fault);
                }
                server.kill()?;
                server.start_again()?;
                (Victim::Index(0), "server".to_owned())
            }
            Servers::Members(members) => {
                let set = members.control();
                let victim = set.victim();
                let mut component = format!("member {victim}");
                match fault {
                    Fault::Kill => set.kill_member(victim)?,
                    Fault::Stop => set.pause_member(victim)?,
                    Fault::Restart => {
                        set.kill_member(victim)?;
                        set.start_member_again(victim)?;
                    }
                    Fault::Silent => silence(&self.proxies, victim)?,
                    Fault::Wipe => {
                        set.kill_member(victim)?;
                        set.wipe_member(victim)?;
                        // A member may refuse to start without the data its
                        // peers know it had (etcd: "already bootstrapped"):
                        // then it stays down, as if killed, and the case
                        // says so.
                        component.push_str(if set.start_member_again(victim).is_ok() {
                            ", wiped"
                        } else {
                            ", wiped; it did not start again"
                        });
                    }
                }
                (Victim::Index(victim), component)
            }
        };
        self.failed = Some(victim);
        Ok(component)
    }

    /// Ends a stop (SIGCONT) or a silence (the network heals).
    fn resume(&mut self, fault: Fault) -> TestResult {
        match (&self.servers, self.failed) {
            (_, Some(Victim::Index(i))) if fault == Fault::Silent => {
                if let Some(proxy) = self.proxies.get(i) {
                    proxy.controls().heal();
                }
                Ok(())
            }
            (Servers::Replicas { replicas, .. }, Some(Victim::Index(i))) => replicas.resume(i),
            (Servers::Sentinel(set), Some(Victim::Port(port))) => set.resume(port),
            (Servers::Cluster { cluster, .. }, Some(Victim::Port(port))) => cluster.resume(port),
            (Servers::Members(members), Some(Victim::Index(i))) => {
                members.control().resume_member(i)
            }
            _ => Ok(()),
        }
    }
}

/// Swallows everything between the clients and endpoint `i`.
fn silence(proxies: &[FaultProxy], i: usize) -> TestResult {
    let proxy = proxies
        .get(i)
        .ok_or("the deployment was not started behind fault proxies")?;
    proxy.controls().partition();
    Ok(())
}

impl Members {
    fn start(shape: Shape) -> TestResult<Self> {
        Ok(match shape {
            Shape::Redlock => Members::Redlock(RedisSet::start(3)?),
            Shape::Redlock5 => Members::Redlock(RedisSet::start(5)?),
            Shape::Etcd => Members::Etcd(EtcdCluster::start_members(3)?),
            Shape::Zookeeper => Members::Zookeeper(ZkServer::start_members(3)?),
            other => return Err(format!("{} is not a member set", other.name()).into()),
        })
    }

    fn control(&self) -> &dyn MemberControl {
        match self {
            Members::Redlock(s) => s,
            Members::Etcd(c) => c,
            Members::Zookeeper(z) => z,
        }
    }
}

/// `url` as it is, or, when `silent`, through a fault proxy started for
/// each of its endpoints (kept in that order).
async fn behind_proxies(url: &str, silent: bool) -> TestResult<(String, Vec<FaultProxy>)> {
    if !silent {
        return Ok((url.to_owned(), Vec::new()));
    }
    let mut proxies = Vec::new();
    for upstream in endpoints(url)? {
        proxies.push(FaultProxy::start(upstream).await?);
    }
    let addrs: Vec<_> = proxies.iter().map(FaultProxy::addr).collect();
    Ok((with_endpoints(url, &addrs)?, proxies))
}

fn not_offered<T>(fault: Fault) -> TestResult<T> {
    Err(format!("{} is not offered for this shape", fault_name(fault)).into())
}

/// The member operations the cases use, alike for every member set.
trait MemberControl {
    /// The member to fail: the leader where there is one, else the first.
    fn victim(&self) -> usize;
    fn kill_member(&self, i: usize) -> TestResult;
    fn pause_member(&self, i: usize) -> TestResult;
    fn resume_member(&self, i: usize) -> TestResult;
    fn start_member_again(&self, i: usize) -> TestResult;
    fn wipe_member(&self, i: usize) -> TestResult;
    fn url(&self) -> String;
}

impl<E: fencelock_testkit::servers::members::Engine> MemberControl
    for fencelock_testkit::servers::members::MemberSet<E>
{
    fn victim(&self) -> usize {
        self.leader().unwrap_or(0)
    }
    fn kill_member(&self, i: usize) -> TestResult {
        self.kill(i)
    }
    fn pause_member(&self, i: usize) -> TestResult {
        self.pause(i)
    }
    fn resume_member(&self, i: usize) -> TestResult {
        self.resume(i)
    }
    fn start_member_again(&self, i: usize) -> TestResult {
        self.start_again(i)
    }
    fn wipe_member(&self, i: usize) -> TestResult {
        self.wipe(i)
    }
    fn url(&self) -> String {
        fencelock_testkit::servers::members::MemberSet::url(self)
    }
}

/// One case's figures.
#[derive(Debug, Serialize)]
pub struct Case {
    shape: Shape,
    fault: Fault,
    /// What was failed.
    component: String,
    /// The holders' lease.
    ttl_ms: u64,
    /// The shape's failover time for this fault, which bounds the window.
    failover_ms: u64,
    holders: usize,
    unnecessary_losses: usize,
    /// Calls of new callers and waiters.
    calls: usize,
    failed_calls: usize,
    /// The first failure's message, if any.
    first_failure: Option<String>,
    /// Why the first holder that lost its lock lost it, if any did.
    first_loss: Option<String>,
    window_ms: Option<u64>,
    recovery_ms: Option<u64>,
    /// Waiters' tokens not above the holder's before them (must be 0).
    token_regressions: usize,
}

/// What every probe and waiter call ended as.
#[derive(Default)]
pub(crate) struct Calls {
    /// When each caller started and when it was granted (`None`: failed).
    pub(crate) probes: Vec<(Instant, Option<Instant>)>,
    pub(crate) failures: Vec<String>,
}

impl Calls {
    /// The longest stretch after `at` without a grant, up to the last
    /// grant (a case ends with grants flowing again, or it says so).
    pub(crate) fn window_after(&self, at: Instant) -> Option<Duration> {
        let mut grants: Vec<Instant> = self.probes.iter().filter_map(|(_, g)| *g).collect();
        grants.sort();
        let mut window = None;
        let mut last = at;
        for &g in grants.iter().filter(|&&g| g > at) {
            let gap = g - last;
            window = Some(window.map_or(gap, |w: Duration| w.max(gap)));
            last = g;
        }
        window
    }

    /// From `at` to the first grant of a caller that started after it.
    pub(crate) fn recovery_after(&self, at: Instant) -> Option<Duration> {
        self.probes
            .iter()
            .filter(|(started, _)| *started >= at)
            .filter_map(|(_, granted)| *granted)
            .min()
            .map(|g| g - at)
    }
}

/// Runs the scorecard: every shape asked for, every fault asked for.
pub async fn run(args: ScorecardArgs, out: Output) -> Result<Verdict, Error> {
    crate::until_interrupted("scorecard", scorecard(args, out), out).await
}

async fn scorecard(args: ScorecardArgs, out: Output) -> Result<Verdict, Error> {
    if let Some(path) = &args.topology {
        return partition(path, &args, out).await;
    }
    let shapes = if args.shapes.is_empty() {
        Shape::ALL.to_vec()
    } else {
        args.shapes
    };
    let faults = if args.faults.is_empty() {
        vec![Fault::Kill, Fault::Stop]
    } else {
        args.faults
    };
    let mut cases = Vec::new();
    for &shape in &shapes {
        for &fault in &faults {
            if let Some(why) = shape.refuses(fault) {
                out.note(format!(
                    "{} / {}: not offered ({why})",
                    shape.name(),
                    fault_name(fault)
                ));
                continue;
            }
            out.note(format!(
                "{} / {}: starting",
                shape.name(),
                fault_name(fault)
            ));
            let case = run_case(shape, fault, args.ttl)
                .await
                .map_err(|e| Error::InvalidArgument(format!("{}: {e}", shape.name())))?;
            out.note(format!(
                "{} / {}: {} losses{}, {} of {} calls failed{}, window {:?} ms",
                shape.name(),
                fault_name(fault),
                case.unnecessary_losses,
                case.first_loss
                    .as_ref()
                    .map(|f| format!(" (the first: {f})"))
                    .unwrap_or_default(),
                case.failed_calls,
                case.calls,
                case.first_failure
                    .as_ref()
                    .map(|f| format!(" (the first: {f})"))
                    .unwrap_or_default(),
                case.window_ms
            ));
            cases.push(case);
        }
    }
    let unsafe_cases = cases.iter().filter(|c| c.token_regressions > 0).count();
    out.emit(&cases, || table(&cases));
    Ok(if unsafe_cases > 0 {
        Verdict::Violation
    } else {
        Verdict::Passed
    })
}

/// `--topology`: the lab, one site cut off.
async fn partition(
    path: &std::path::Path,
    args: &ScorecardArgs,
    out: Output,
) -> Result<Verdict, Error> {
    let bad = |what: String| Error::InvalidArgument(what);
    let (Some(engine), Some(isolate)) = (args.engine, args.isolate.as_deref()) else {
        return Err(bad("--topology needs --engine and --isolate".into()));
    };
    let topology = topology::load(path).map_err(bad)?;
    engine.check(&topology).map_err(bad)?;
    let site = topology.site(isolate).ok_or_else(|| {
        bad(format!(
            "--isolate {isolate:?} is not a site of {}",
            path.display()
        ))
    })?;
    let ttl = args
        .ttl
        .unwrap_or_else(|| engine.failover(topology.longest_rtt()) * 3);
    out.note(format_args!(
        "starting {} in {} site(s) of {}…",
        engine.name(),
        topology.sites().len(),
        path.display()
    ));
    let lab = Lab::start(topology, engine)
        .await
        .map_err(|e| bad(format!("the lab did not start: {e}")))?;
    out.note(format_args!(
        "cutting {isolate} off for {:?} (leases {ttl:?})…",
        ttl * 2
    ));
    let case = topology::partition::run(&lab, site, ttl, ttl * 2)
        .await
        .map_err(|e| bad(format!("partition of {isolate}: {e}")))?;
    out.emit(&case, || case.human());
    Ok(if case.violations() > 0 {
        Verdict::Violation
    } else {
        Verdict::Passed
    })
}

fn fault_name(fault: Fault) -> &'static str {
    match fault {
        Fault::Kill => "kill",
        Fault::Stop => "stop",
        Fault::Restart => "restart",
        Fault::Silent => "silent",
        Fault::Wipe => "wipe",
    }
}

/// The human form: one Markdown row per case, as docs/faults.md shows it.
fn table(cases: &[Case]) -> String {
    let ms = |v: Option<u64>| v.map_or("–".to_owned(), |v| format!("{v} ms"));
    let mut text = String::from(
        "| shape | fault | failed | TTL | unnecessary losses | failed calls | window | recovery | token regressions |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for c in cases {
        text.push_str(&format!(
            "| {} | {} | {} | {} s | {} of {} | {} of {} | {} | {} | {} |\n",
            c.shape.name(),
            fault_name(c.fault),
            c.component,
            c.ttl_ms / 1000,
            c.unnecessary_losses,
            c.holders,
            c.failed_calls,
            c.calls,
            ms(c.window_ms),
            ms(c.recovery_ms),
            c.token_regressions,
        ));
    }
    text
}

pub(crate) fn client(
    backend: &Arc<dyn fencelock::Backend>,
    owner: &str,
) -> Result<LockClient, Error> {
    LockClient::builder(Arc::clone(backend))
        .owner(Owner::new(owner)?)
        .build()
}

/// One shape under one fault; the holders' lease is `at_least` where that
/// is longer than three failover times and 3 s.
async fn run_case(shape: Shape, fault: Fault, at_least: Option<Duration>) -> TestResult<Case> {
    let run = format!("scorecard-{}", std::process::id());
    let mut deployment = Deployment::start(shape, fault, &format!("{run}:held:0")).await?;
    let url = deployment.url();
    let failover = shape.failover(fault);
    let ttl = (failover * 3)
        .max(Duration::from_secs(3))
        .max(at_least.unwrap_or_default());
    let patience = failover * (STOP_FOR + 2) + ttl;

    let backend = fencelock::open_backend(&url).await?;
    let holders = client(&backend, "holder")?;
    let mut guards: Vec<LockGuard> = Vec::new();
    for i in 0..HOLDERS {
        guards.push(
            holders
                .lock(format!("{run}:held:{i}"))
                .ttl(ttl)
                .acquire()
                .await?,
        );
    }
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let backend = Arc::clone(&backend);
        let key = format!("{run}:held:{i}");
        waiters.push(tokio::spawn(async move {
            let waiter = client(&backend, &format!("waiter-{i}"))?;
            let guard = waiter
                .lock(key)
                .ttl(ttl)
                .wait(patience * 2)
                .acquire()
                .await?;
            let token = guard.token();
            guard.release().await?;
            Ok::<_, Error>(token)
        }));
    }
    let stop_probes = Arc::new(AtomicBool::new(false));
    let prober = {
        let calls = Arc::clone(&calls);
        let url = url.clone();
        let stop = stop_probes.clone();
        let run = run.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut running = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let calls = Arc::clone(&calls);
                let url = url.clone();
                let key = format!("{run}:probe:{n}");
                running.push(tokio::spawn(async move {
                    let started = Instant::now();
                    let outcome = probe(&url, &key, ttl, patience).await;
                    let mut calls = calls.lock().unwrap_or_else(PoisonError::into_inner);
                    match outcome {
                        Ok(granted) => calls.probes.push((started, Some(granted))),
                        Err(e) => {
                            calls.probes.push((started, None));
                            calls.failures.push(format!("new caller: {e}"));
                        }
                    }
                }));
                tokio::time::sleep(PROBE_EVERY).await;
            }
            for task in running {
                let _ = task.await;
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    let failed_at = Instant::now();
    let component = tokio::task::block_in_place(|| deployment.fail(fault))?;
    if matches!(fault, Fault::Stop | Fault::Silent) {
        tokio::time::sleep(failover * STOP_FOR).await;
        tokio::task::block_in_place(|| deployment.resume(fault))?;
    }
    tokio::time::sleep_until(failed_at + failover * (STOP_FOR + 1) + ttl).await;
    stop_probes.store(true, Ordering::Relaxed);
    let _ = prober.await;

    let losses = guards.iter().filter(|g| !g.is_valid()).count();
    let lost_why = guards.iter().find_map(|g| g.check().err());
    let tokens: Vec<_> = guards.iter().map(|g| g.token()).collect();
    for guard in guards {
        // A lost guard's release is refused: nothing to count there.
        let _ = guard.release().await;
    }
    let mut calls = std::mem::take(&mut *calls.lock().unwrap_or_else(PoisonError::into_inner));
    let mut failures = std::mem::take(&mut calls.failures);
    let mut regressions = 0;
    for (i, waiter) in waiters.into_iter().enumerate() {
        match waiter.await {
            Ok(Ok(token)) if token <= tokens[i] => regressions += 1,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failures.push(format!("waiter {i}: {e}")),
            Err(e) => failures.push(format!("waiter {i}: {e}")),
        }
    }
    let window = calls.window_after(failed_at);
    let recovery = calls.recovery_after(failed_at);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Ok(Case {
        shape,
        fault,
        component,
        ttl_ms: ms(ttl),
        failover_ms: ms(failover),
        holders: HOLDERS,
        unnecessary_losses: losses,
        calls: calls.probes.len() + WAITERS,
        failed_calls: failures.len(),
        first_failure: failures.into_iter().next(),
        first_loss: lost_why.map(|e| e.to_string()),
        window_ms: window.map(ms),
        recovery_ms: recovery.map(ms),
        token_regressions: regressions,
    })
}

/// A new caller: opens a backend of its own, takes `key` waiting up to
/// `wait`, releases it; answers when it was granted.
async fn probe(url: &str, key: &str, ttl: Duration, wait: Duration) -> Result<Instant, Error> {
    within_wait(wait, async {
        // As `fencelock run --wait` does: opening rides through the
        // failover too.
        let backend = fencelock::open_backend_within(url, wait).await?;
        take_and_release(&backend, key, ttl, wait).await
    })
    .await
}

/// A new caller on `backend`: takes `key` waiting up to `wait`, releases
/// it; answers when it was granted.
pub(crate) async fn take_and_release(
    backend: &Arc<dyn fencelock::Backend>,
    key: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Instant, Error> {
    let caller = client(backend, "caller")?;
    let guard = caller.lock(key).ttl(ttl).wait(wait).acquire().await?;
    let granted = Instant::now();
    guard.release().await?;
    Ok(granted)
}

/// `call`, a new caller's, bounded by its `wait` and 5 s more (a caller
/// that outstays its wait is a failed call).
pub(crate) async fn within_wait(
    wait: Duration,
    call: impl std::future::Future<Output = Result<Instant, Error>>,
) -> Result<Instant, Error> {
    let bound = wait + Duration::from_secs(5);
    tokio::time::timeout(bound, call)
        .await
        .unwrap_or(Err(Error::OperationTimeout {
            operation: "new caller",
            after: bound,
        }))
}
