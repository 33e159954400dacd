//! A running lab: an engine's throwaway servers placed in the sites of a
//! [`Topology`], every link between two sites behind a fault proxy that
//! delays it, and a URL for the clients of each site.
//!
//! Which links are delayed:
//!
//! - **client to member**: one proxy per client site and member in another
//!   site, both ways at the sites' one-way delay;
//! - **member to member**, for the engines whose members talk (etcd,
//!   ZooKeeper), one link per pair at its sites' delay: ZooKeeper's
//!   members each name their peers in a file of their own; an etcd member
//!   advertises one peer URL to all its peers, so a router stands there
//!   and sends each peer's connections through that pair's link (the
//!   `router` module). A connection no router can attribute takes the
//!   member's own link, at the mean of its one-way delays to its peers
//!   ([`Topology::member_ingress`]). A ZooKeeper member that dials a
//!   higher id's election port names its own election address in its
//!   greeting, and the higher id hangs up and dials that address back: the
//!   link rewrites it to the higher id's link back
//!   (`zookeeper::election_greeting`), so that dial too crosses the link.
//!
//! The `sharded` engine has no members that talk: one Redis server per
//! member site, each a shard named after its site, and per client site a
//! `sharded://` map whose shard URLs go through that site's links, with a
//! `[[place]]` rule homing the keys of each member site
//! ([`Lab::key_prefix`]) on that site's shard (docs/sharding.md,
//! "Placement").
//!
//! [`Lab::isolate`] cuts a site off: every link with one end there
//! swallows everything, both ways.
//!
//! A proxy delays data, not the TCP handshake: a new connection's first
//! request pays the round trip, its set-up does not.

use std::{
    any::Any,
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use clap::ValueEnum;
use fencelock::sharded::{Phase, Placement, Shard, ShardMap};
use fencelock_testkit::{
    proxy::{endpoints, with_endpoints, Direction, FaultProxy, Greeting},
    servers::{
        etcd::EtcdCluster,
        members::PeerLink,
        postgres::PostgresServer,
        redis_set::RedisSet,
        zookeeper::{self, ZkServer},
    },
    TestResult,
};
use serde::Serialize;
use tokio::runtime::Handle;

use super::{
    router::{Members, Router},
    ClientEndpoints, Delay, Topology,
};

/// The engines a lab can place in sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabEngine {
    /// Independent Redis nodes (`redlock://`), one per member.
    Redlock,
    /// An etcd cluster, one member per member.
    Etcd,
    /// A ZooKeeper ensemble, one member per member.
    Zookeeper,
    /// One PostgreSQL server, in the first member's site.
    Postgres,
    /// One Redis server per member site, each the shard of a `sharded://`
    /// map that homes the keys of its site there.
    Sharded,
}

impl LabEngine {
    /// How long the engine's healthy majority needs to carry on without a
    /// member cut off from it, its sites `rtt` apart at most: the
    /// scorecard's failover time on loopback (docs/faults.md), plus the
    /// round trips a failover takes across sites. A partition's leases are
    /// three times this.
    pub fn failover(self, rtt: Duration) -> Duration {
        match self {
            // No failover: a majority answers; a cut node costs one
            // request's bound.
            // No failover either: a key's home shard answers alone.
            LabEngine::Redlock | LabEngine::Sharded => Duration::from_secs(1) + rtt,
            // The test kit's election timeout, then a vote and the new
            // leader's first appends and lease promotion: measured 4.1 to
            // 4.3 s at 300 ms (docs/multi-dc.md).
            LabEngine::Etcd => Duration::from_secs(2) + rtt * 8,
            // Followers give up on a silent leader after syncLimit ticks
            // (the test kit's 5 × 2 s), then elect; sessions then move.
            LabEngine::Zookeeper => Duration::from_secs(13) + rtt * 8,
            // A crash, its recovery, the pool's new connections.
            LabEngine::Postgres => Duration::from_secs(3) + rtt,
        }
    }

    /// Whether the topology's clients can reach this engine as it asks:
    /// the error says why not.
    pub fn check(self, topology: &Topology) -> Result<(), String> {
        if self == LabEngine::Sharded && topology.client_options().is_some() {
            return Err(
                "client_options applies to engines opened by one URL; the sharded \
                        engine's clients open a map of shards"
                    .into(),
            );
        }
        match (topology.client_endpoints(), self) {
            (ClientEndpoints::All, _)
            | (ClientEndpoints::Site, LabEngine::Etcd | LabEngine::Zookeeper)
            | (ClientEndpoints::Nearest, LabEngine::Etcd | LabEngine::Zookeeper) => Ok(()),
            (ClientEndpoints::Nearest, _) => Err(format!(
                "client_endpoints = \"nearest\" applies to etcd and zookeeper \
                 (balance=first); a {} client chooses its members itself",
                self.name()
            )),
            (ClientEndpoints::Site, _) => Err(format!(
                "client_endpoints = \"site\" applies to etcd and zookeeper, whose clients \
                 need one member; a {} client needs them all",
                self.name()
            )),
        }
    }

    /// The engine's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LabEngine::Redlock => "redlock",
            LabEngine::Etcd => "etcd",
            LabEngine::Zookeeper => "zookeeper",
            LabEngine::Postgres => "postgres",
            LabEngine::Sharded => "sharded",
        }
    }
}

/// How long a link waits for a port that refuses to open (the test kit's
/// `set_upstream_patience`): the 1 s a ZooKeeper follower waits between
/// its tries to reach a leader, twice.
const LINK_PATIENCE: Duration = Duration::from_secs(2);

/// The least retransmission time-out of Linux's TCP (`TCP_RTO_MIN`), on top
/// of the round trip: what a lost chunk costs on a lossy link.
const MIN_RTO: Duration = Duration::from_millis(200);

/// The servers a lab started, of whichever engine, kept to be stopped when
/// it is dropped; shared with the tasks of `torture --topology`.
type Servers = Box<dyn Any + Send + Sync>;

/// See the module docs. Dropping it stops the servers and the proxies.
#[derive(Debug)]
pub struct Lab {
    topology: Topology,
    engine: LabEngine,
    /// The site of each member started.
    placed: Vec<usize>,
    /// The URL clients of each site use, by site.
    urls: Vec<Option<String>>,
    /// Every link between two sites.
    links: Vec<Link>,
    /// etcd's peer routers, kept to run as long as the lab.
    _routers: Vec<Router>,
    /// The sharded engine's map (member addresses, as every client
    /// site's map routes alike), which says where a key lives.
    homes: Option<ShardMap>,
    /// The servers, kept to be stopped when the lab is dropped, and the
    /// sharded engine's map files.
    _servers: Servers,
    maps: Option<tempfile::TempDir>,
}

impl Lab {
    /// Starts `engine`'s members in their sites, the links between sites,
    /// and one URL per client site.
    pub async fn start(topology: Topology, engine: LabEngine) -> TestResult<Lab> {
        // PostgreSQL is one server: it stands where the first member does.
        let placed = match engine {
            LabEngine::Postgres => topology.members()[..1].to_vec(),
            // A shard per site: members of one site would be one shard.
            LabEngine::Sharded => {
                let mut sites = Vec::new();
                for &site in topology.members() {
                    if !sites.contains(&site) {
                        sites.push(site);
                    }
                }
                sites
            }
            _ => topology.members().to_vec(),
        };
        let members = placed.len();
        engine.check(&topology)?;
        // Peer links are made while the members are laid out, on a
        // blocking thread; the proxies run on this runtime.
        let made = Arc::new(Mutex::new(Made::default()));
        // Where each member dials each address of a peer: a ZooKeeper
        // member named in an election greeting is dialled back there.
        let dialled: Arc<Mutex<HashMap<(usize, SocketAddr), SocketAddr>>> = Arc::default();
        let (servers, url) = {
            let topology = topology.clone();
            let made = Arc::clone(&made);
            let handle = Handle::current();
            let routed = Members::default();
            tokio::task::spawn_blocking(move || -> TestResult<(Servers, String)> {
                let link: &PeerLink<'_> = &|from, to, addr| {
                    let sites = topology.members();
                    let made = &mut *lock(&made);
                    match from {
                        Some(f) => {
                            let through = handle.block_on(made.link(
                                Some(sites[f]),
                                sites[to],
                                addr,
                                topology.link(sites[f], sites[to]),
                            ))?;
                            lock(&dialled).insert((f, addr), through);
                            if engine == LabEngine::Zookeeper && through != addr {
                                // `to` dials a lower id back at the address
                                // its greeting names: make it `to`'s link.
                                let dialled = Arc::clone(&dialled);
                                let greeting = zookeeper::election_greeting(move |named| {
                                    lock(&dialled).get(&(to, named)).copied()
                                });
                                made.greet(greeting);
                            }
                            Ok(through)
                        }
                        // One advertised URL for every peer: a router in
                        // front of it sends each peer's connections through
                        // the link of that pair.
                        None => handle.block_on(async {
                            let mut links = HashMap::new();
                            for (m, &at) in sites.iter().enumerate().filter(|&(m, _)| m != to) {
                                let link = topology.link(at, sites[to]);
                                links.insert(m, made.link(Some(at), sites[to], addr, link).await?);
                            }
                            let ingress = topology.member_ingress(to);
                            let unnamed =
                                made.link(None, sites[to], addr, (ingress, ingress)).await?;
                            let router =
                                Router::start(to, Arc::clone(&routed), links, unnamed).await?;
                            let through = router.addr();
                            made.routers.push(router);
                            Ok(through)
                        }),
                    }
                };
                Ok(match engine {
                    LabEngine::Redlock | LabEngine::Sharded => {
                        let set = RedisSet::start(members)?;
                        let url = set.url();
                        (Box::new(set) as Servers, url)
                    }
                    LabEngine::Etcd => {
                        let set = EtcdCluster::start_linked(members, link)?;
                        let url = set.url();
                        (Box::new(set) as Servers, url)
                    }
                    LabEngine::Zookeeper => {
                        let set = ZkServer::start_linked(members, link)?;
                        let url = set.url();
                        (Box::new(set) as Servers, url)
                    }
                    LabEngine::Postgres => {
                        let server = PostgresServer::start()?;
                        let url = server.url("postgres");
                        (Box::new(server) as Servers, url)
                    }
                })
            })
            .await??
        };
        let mut made = std::mem::take(&mut *lock(&made));
        let member_addrs = endpoints(&url)?;
        let homes = (engine == LabEngine::Sharded)
            .then(|| shard_map(topology.sites(), &placed, &member_addrs))
            .transpose()?;
        let maps = homes.as_ref().map(|_| tempfile::tempdir()).transpose()?;
        let mut urls = vec![None; topology.sites().len()];
        for &site in topology.clients() {
            let mut addrs = Vec::with_capacity(member_addrs.len());
            for (m, &addr) in member_addrs.iter().enumerate() {
                let at = placed[m];
                addrs.push(
                    made.link(Some(site), at, addr, topology.link(site, at))
                        .await?,
                );
            }
            if matches!(engine, LabEngine::Etcd | LabEngine::Zookeeper) {
                // A client lists its nearest members first, as an operator
                // would, or those of its site alone. (Redlock's node order
                // is part of the protocol, the same for every client: left
                // as it is.)
                let only_site =
                    topology.client_endpoints() == ClientEndpoints::Site && placed.contains(&site);
                let mut listed: Vec<(Duration, SocketAddr)> = placed
                    .iter()
                    .zip(addrs)
                    .filter(|(&at, _)| !only_site || at == site)
                    .map(|(&at, addr)| (topology.rtt(site, at), addr))
                    .collect();
                listed.sort_by_key(|(d, _)| *d);
                addrs = listed.into_iter().map(|(_, a)| a).collect();
            }
            let site_url = match &maps {
                // This site's map: the same shards and rules, through its
                // links.
                Some(dir) => {
                    let path = map_path(dir, &topology.sites()[site]);
                    std::fs::write(
                        &path,
                        shard_map(topology.sites(), &placed, &addrs)?.to_toml(),
                    )?;
                    format!("sharded://{}", path.display())
                }
                None => {
                    let mut site_url = with_endpoints(&url, &addrs)?;
                    let nearest = (topology.client_endpoints() == ClientEndpoints::Nearest)
                        .then_some("balance=first");
                    for options in nearest.into_iter().chain(topology.client_options()) {
                        site_url.push(if site_url.contains('?') { '&' } else { '?' });
                        site_url.push_str(options);
                    }
                    site_url
                }
            };
            urls[site] = Some(site_url);
        }
        Ok(Lab {
            topology,
            engine,
            placed,
            urls,
            links: made.links,
            _routers: made.routers,
            homes,
            _servers: servers,
            maps,
        })
    }

    /// What the keys of callers standing in `site` start with: the
    /// sharded engine homes them on that site's shard (the other engines
    /// ignore it).
    pub fn key_prefix(&self, site: usize) -> String {
        key_prefix(&self.topology.sites()[site])
    }

    /// The site whose shard holds `key`, for the sharded engine (`None`
    /// for the others, whose keys live on a majority of the members).
    pub fn home_of(&self, key: &str) -> Option<usize> {
        self.topology.site(&self.homes.as_ref()?.owner(key).name)
    }

    /// The sharded engine's maps, for clients in `site`, of the four steps
    /// of moving the home of the keys starting with `prefix` from the shard
    /// of site `from` to that of site `to` (docs/sharding.md, "Moving a
    /// key's home"): their `sharded://` URLs, in order. Each is the site's
    /// own map with one more rule; the first is the lab's epoch, so opening
    /// the third retires the lab's own maps (two steps behind): move last.
    pub fn reshard_urls(
        &self,
        site: usize,
        prefix: &str,
        from: usize,
        to: usize,
    ) -> TestResult<Vec<String>> {
        let dir = self
            .maps
            .as_ref()
            .ok_or("only the sharded engine has maps")?;
        let sites = self.topology.sites();
        let base = ShardMap::read(&map_path(dir, &sites[site]))?;
        let homed = |home: usize| {
            let mut rules = base.placement.clone();
            rules.push(Placement::prefix(prefix, sites[home].as_str()));
            rules
        };
        let map =
            |epoch, home| ShardMap::new(epoch, base.shards.clone())?.with_placement(homed(home));
        let steps = [
            map(base.epoch, from)?,
            map(base.epoch + 1, to)?.in_transition_placed(
                Phase::Join,
                base.shards.clone(),
                homed(from),
            )?,
            map(base.epoch + 2, to)?.in_transition_placed(
                Phase::Handover,
                base.shards.clone(),
                homed(from),
            )?,
            map(base.epoch + 3, to)?,
        ];
        let mut urls = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let path = dir
                .path()
                .join(format!("{}-step{}.toml", sites[site], i + 1));
            std::fs::write(&path, step.to_toml())?;
            urls.push(format!("sharded://{}", path.display()));
        }
        Ok(urls)
    }

    /// The round trip from `site` to the home of its own keys (sharded
    /// engine only): the floor of one operation on them.
    pub fn home_rtt(&self, site: usize) -> Option<Duration> {
        let home = self.home_of(&self.key_prefix(site))?;
        Some(self.topology.rtt(site, home))
    }

    /// The topology it runs.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The engine it runs.
    pub fn engine(&self) -> LabEngine {
        self.engine
    }

    /// The URL for clients standing in `site`, if clients stand there.
    pub fn url_from(&self, site: usize) -> Option<&str> {
        self.urls.get(site)?.as_deref()
    }

    /// The site of each member started, in member order.
    pub fn placed(&self) -> &[usize] {
        &self.placed
    }

    /// [`Topology::nearest_majority_rtt`] of the members started.
    pub fn nearest_majority_rtt(&self, site: usize) -> Duration {
        self.topology.nearest_majority_rtt(site, &self.placed)
    }

    /// How many links between two sites run (client to member, and member
    /// to member).
    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// Cuts `site` off from every other: each link with one end there
    /// swallows everything both ways, on open connections and new ones.
    pub fn isolate(&self, site: usize) {
        for link in self.links.iter().filter(|l| l.crosses(site)) {
            link.proxy.controls().set_blackhole(Direction::Both, true);
        }
    }

    /// Ends every partition; the delays stay. Connections that lost bytes
    /// are reset, as TCP would give up on them (see the fault proxy).
    pub fn heal(&self) {
        for link in &self.links {
            link.proxy.controls().set_blackhole(Direction::Both, false);
        }
    }
}

/// The sharded engine's map file for clients in `site`.
fn map_path(dir: &tempfile::TempDir, site: &str) -> std::path::PathBuf {
    dir.path().join(format!("{site}.toml"))
}

/// See [`Lab::key_prefix`].
fn key_prefix(site: &str) -> String {
    format!("{site}:")
}

/// The sharded engine's map for clients that reach the server of
/// `placed[m]` at `addrs[m]`: a shard per member site, named after it, and
/// a rule homing that site's keys there.
fn shard_map(sites: &[String], placed: &[usize], addrs: &[SocketAddr]) -> TestResult<ShardMap> {
    let shards = placed
        .iter()
        .zip(addrs)
        .map(|(&site, addr)| Shard::new(sites[site].as_str(), format!("redis://{addr}")))
        .collect();
    let rules: Vec<Placement> = placed
        .iter()
        .map(|&site| Placement::prefix(key_prefix(&sites[site]), sites[site].as_str()))
        .collect();
    Ok(ShardMap::new(1, shards)?.with_placement(rules)?)
}

/// One link between two sites: a proxy, and the sites of its two ends.
#[derive(Debug)]
struct Link {
    /// The site of the end that connects; `None` for a connection an etcd
    /// router could not attribute (the member's own link, at the mean
    /// delay of its peers).
    from: Option<usize>,
    /// The site of the end connected to.
    to: usize,
    proxy: FaultProxy,
}

impl Link {
    /// Whether a partition of `site` cuts this link.
    fn crosses(&self, site: usize) -> bool {
        match self.from {
            Some(from) => (from == site) != (self.to == site),
            None => self.to == site,
        }
    }
}

/// The links and routers made while a lab starts.
#[derive(Default)]
struct Made {
    links: Vec<Link>,
    routers: Vec<Router>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Made {
    /// Rewrites the first message of each connection on the last link made
    /// with `greeting`.
    fn greet(&self, greeting: Greeting) {
        if let Some(link) = self.links.last() {
            link.proxy.controls().set_greeting(Some(greeting));
        }
    }

    /// The address to dial for `upstream` from site `from` (`None`: not
    /// known) to site `to`: `upstream` itself within one site, else a
    /// proxy delaying the way there by `there` and the way back by `back`.
    async fn link(
        &mut self,
        from: Option<usize>,
        to: usize,
        upstream: SocketAddr,
        (there, back): (Delay, Delay),
    ) -> std::io::Result<SocketAddr> {
        if from == Some(to) {
            return Ok(upstream);
        }
        let proxy = FaultProxy::start(upstream).await?;
        let controls = proxy.controls();
        controls.set_latency(Direction::ToServer, there.one_way, there.jitter);
        controls.set_latency(Direction::ToClient, back.one_way, back.jitter);
        // A lost segment arrives once TCP resends it, a retransmission
        // time-out later: Linux's is the smoothed round trip plus at least
        // 200 ms.
        let resend_after = there.one_way + back.one_way + MIN_RTO;
        controls.set_loss(Direction::ToServer, there.loss(), resend_after);
        controls.set_loss(Direction::ToClient, back.loss(), resend_after);
        // A port about to open is reached as the dialling end's own
        // retries would reach it, not reset after the proxy accepted: a
        // ZooKeeper member reset while it registers with a leader that has
        // just won an election returns to the election, and across 150 ms
        // links an ensemble missing one site never settled on a leader.
        controls.set_upstream_patience(LINK_PATIENCE);
        let addr = proxy.addr();
        self.links.push(Link { from, to, proxy });
        Ok(addr)
    }
}
