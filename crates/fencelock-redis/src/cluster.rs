//! A Redis Cluster, followed through failovers.
//!
//! The cluster client keeps a slot map and refreshes it when a node
//! redirects a request (`MOVED`). A primary that stops without closing its
//! connections redirects nothing: after the cluster has promoted its
//! replica, requests for its slots still go to it and wait, so a holder
//! loses the lease the promoted replica holds, and a new caller waits until
//! the old primary resumes. (A refresh would not help reliably either: it
//! asks the nodes one at a time, under a lock every request waits for,
//! with no time-out, and may ask the stopped one first.)
//!
//! So the connection is followed as [`crate::follow`] says. A search asks
//! every node it knows `CLUSTER SLOTS` at once, each within
//! [`ASK_WITHIN`], then the nodes their answers name. When an answer names
//! other primaries than the map read when the connection was made, and no
//! node it names stalled (a node that refuses connections fails at once),
//! a new cluster connection is started from those nodes (so its start,
//! which pings each node without a time-out, waits on none that is silent)
//! and replaces the old one. While
//! the answers agree with that map, a primary that did not answer means the
//! cluster is still judging it: the search asks again. Every primary
//! answering means there was no failover.
//!
//! Opening asks the same way, until an answer names no stalled node or the
//! connect time-out ends: a client started during a failover waits for it, instead
//! of waiting on the stopped node until it resumes.

use std::{sync::Arc, time::Duration};

use futures_util::future::join_all;
use redis::{cluster_async::ClusterConnection, Client, ErrorKind, RedisError, RedisResult, Value};
use url::Url;

use tokio::time::Instant;

use crate::{
    error::map,
    follow::{Follower, Source, ASK_EVERY, ASK_WITHIN},
    options::RedisOptions,
};

/// The cluster connection of a `redis+cluster://` URL, followed through
/// failovers.
pub(crate) type ClusterFollower = Follower<ClusterNodes>;

/// A node's address as `CLUSTER SLOTS` names it.
type Addr = (String, u16);

/// The port of a node URL that names none.
const DEFAULT_PORT: u16 = 6379;

/// The nodes of a cluster and how to reach them.
pub(crate) struct ClusterNodes {
    /// The URL's nodes: asked too, whatever the map says.
    seeds: Vec<Url>,
    connect_timeout: Duration,
}

/// The cluster connection of the moment, and the map read when it was made.
#[derive(Clone)]
pub(crate) struct Current {
    /// The connection requests go on.
    pub(crate) conn: ClusterConnection,
    layout: Arc<Layout>,
}

impl ClusterNodes {
    /// Connects to the cluster the seeds of `options` belong to. A cluster
    /// in the middle of a failover (a node it names does not answer) is
    /// asked again until the failover ends, within the connect time-out: a
    /// client started then waits for it instead of waiting on the silent
    /// node.
    pub(crate) async fn connect(
        options: &RedisOptions,
    ) -> fencelock_core::Result<Arc<ClusterFollower>> {
        let nodes = Self {
            seeds: options.cluster_nodes.clone(),
            connect_timeout: options.connect_timeout,
        };
        // Leaves the last survey time to end inside the caller's bound.
        let until = Instant::now() + options.connect_timeout.saturating_sub(2 * ASK_WITHIN);
        let current = loop {
            let survey = nodes.survey(&Layout::default()).await;
            let attempt = match survey.whole(None) {
                Some(layout) => nodes.open(layout).await,
                None => Err(survey.why_not()),
            };
            match attempt {
                Ok(current) => break current,
                Err(e) if Instant::now() + ASK_EVERY >= until => {
                    return Err(map("cluster connect", e))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "redis cluster: no whole answer yet; asking again");
                    tokio::time::sleep(ASK_EVERY).await;
                }
            }
        };
        Ok(Follower::new(nodes, current))
    }

    /// Asks every node of `known` and every seed `CLUSTER SLOTS` at once,
    /// then every node their answers name that was not asked yet.
    async fn survey(&self, known: &Layout) -> Survey {
        let mut asked = known.nodes();
        for addr in self.seeds.iter().filter_map(seed_addr) {
            if !asked.contains(&addr) {
                asked.push(addr);
            }
        }
        let mut survey = Survey::default();
        while asked.len() > survey.asked.len() {
            let round = asked[survey.asked.len()..].to_vec();
            let answers = join_all(round.iter().map(|addr| self.ask_node(addr))).await;
            for (addr, answer) in round.into_iter().zip(answers) {
                match answer {
                    Ok(layout) => {
                        for named in layout.nodes() {
                            if !asked.contains(&named) {
                                asked.push(named);
                            }
                        }
                        survey.answered.push(addr.clone());
                        survey.layouts.push(layout);
                    }
                    Err(e) => survey.silent.push((addr.clone(), e)),
                }
                survey.asked.push(addr);
            }
        }
        survey
    }

    /// What `addr` answers to `CLUSTER SLOTS`, on a connection of its own
    /// (the URL's scheme, credentials and options), within [`ASK_WITHIN`].
    async fn ask_node(&self, addr: &Addr) -> RedisResult<Layout> {
        let url = node_url(&self.seeds[0], addr)?;
        let asking = async {
            let mut conn = Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let answer: Vec<Value> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await?;
            Ok(Layout::parse(answer, &addr.0))
        };
        tokio::time::timeout(ASK_WITHIN, asking)
            .await
            .unwrap_or_else(|_| Err(crate::conn::timed_out(ASK_WITHIN)))
    }

    /// A cluster connection started from the nodes of `layout`, every one
    /// of which just answered: its start (a `PING` of each node, which has
    /// no time-out of its own) waits on none that is silent.
    async fn open(&self, layout: &Layout) -> RedisResult<Current> {
        let urls = layout
            .nodes()
            .iter()
            .map(|addr| node_url(&self.seeds[0], addr))
            .collect::<RedisResult<Vec<_>>>()?;
        let conn = tokio::time::timeout(
            self.connect_timeout,
            cluster_connection(&urls, self.connect_timeout),
        )
        .await
        .unwrap_or_else(|_| Err(crate::conn::timed_out(self.connect_timeout)))?;
        Ok(Current {
            conn,
            layout: Arc::new(layout.clone()),
        })
    }
}

/// What the nodes asked answered.
#[derive(Default)]
struct Survey {
    asked: Vec<Addr>,
    answered: Vec<Addr>,
    layouts: Vec<Layout>,
    silent: Vec<(Addr, RedisError)>,
}

impl Survey {
    /// An answer that names no node that stalled, and which is not
    /// `other` (as far as primaries go). A node that refused the question
    /// may be named: the cluster client's start fails on it at once (and
    /// the cluster, once it declares the node failed, redirects its slots,
    /// which the client follows on its own).
    fn whole(&self, other: Option<&Layout>) -> Option<&Layout> {
        self.layouts.iter().find(|layout| {
            !layout.ranges.is_empty()
                && other.is_none_or(|other| !layout.same_primaries(other))
                && layout.nodes().iter().all(|n| !self.stalled(n))
        })
    }

    /// Whether `node` was asked and did not answer in time: stopped, or
    /// cut off by a silent network.
    fn stalled(&self, node: &Addr) -> bool {
        self.silent
            .iter()
            .any(|(addr, e)| addr == node && e.is_timeout())
    }

    /// Why no answer is whole.
    fn why_not(&self) -> RedisError {
        match self.silent.first() {
            Some(((host, port), e)) => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("node {host}:{port} did not answer CLUSTER SLOTS ({e})"),
            )
            .into(),
            None => RedisError::from((
                ErrorKind::ClusterDown,
                "no node asked names a node for every slot",
            )),
        }
    }
}

impl Source for ClusterNodes {
    type Conn = Current;

    fn what(&self) -> String {
        "redis cluster".into()
    }

    async fn ask(&self, current: &Current) -> RedisResult<Option<Current>> {
        let survey = self.survey(&current.layout).await;
        if let Some(layout) = survey.whole(Some(&current.layout)) {
            return self.open(layout).await.map(Some);
        }
        match current
            .layout
            .primaries()
            .into_iter()
            .find(|p| !survey.answered.contains(p))
        {
            Some((host, port)) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("primary {host}:{port} did not answer, and no node names another yet"),
            )
            .into()),
            None => Ok(None),
        }
    }
}

/// A cluster client over `nodes`.
pub(crate) async fn cluster_connection(
    nodes: &[Url],
    connect_timeout: Duration,
) -> RedisResult<ClusterConnection> {
    // No response timeout: `BoundedConnection` bounds every request, the
    // client's own retries (redirections, slot map refreshes) included.
    redis::cluster::ClusterClientBuilder::new(nodes.iter().map(Url::as_str))
        .connection_timeout(connect_timeout)
        .build()?
        .get_async_connection()
        .await
}

/// The address a seed's URL names; a seed without a port is on Redis's
/// own, as the driver reads it.
fn seed_addr(seed: &Url) -> Option<Addr> {
    let host = seed.host_str()?.trim_matches(['[', ']']).to_owned();
    Some((host, seed.port().unwrap_or(DEFAULT_PORT)))
}

/// The URL of the node at `addr`: `template` (a seed's URL) with its host
/// and port.
fn node_url(template: &Url, (host, port): &Addr) -> RedisResult<Url> {
    let mut url = template.clone();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    url.set_host(Some(&host))
        .ok()
        .and_then(|()| url.set_port(Some(*port)).ok())
        .ok_or_else(|| {
            RedisError::from((
                ErrorKind::ResponseError,
                "CLUSTER SLOTS named a node that is not an address",
                format!("{host}:{port}"),
            ))
        })?;
    Ok(url)
}

/// Who serves which slots, as one node answers `CLUSTER SLOTS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    ranges: Vec<Range>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Range {
    start: u16,
    end: u16,
    primary: Addr,
    replicas: Vec<Addr>,
}

impl Layout {
    /// Reads an answer to `CLUSTER SLOTS`: `[start, end, [host, port, id,
    /// …], replicas…]` per range. A node may leave its own host empty (it
    /// does not know how it is reached): that is `asked`, the host asked.
    pub(crate) fn parse(answer: Vec<Value>, asked: &str) -> Self {
        let addr = |node: &Value| -> Option<Addr> {
            let Value::Array(fields) = node else {
                return None;
            };
            let host: String = redis::from_redis_value(fields.first()?).ok()?;
            let port: u16 = redis::from_redis_value(fields.get(1)?).ok()?;
            let host = if host.is_empty() || host == "?" {
                asked.to_owned()
            } else {
                host
            };
            Some((host, port))
        };
        let mut ranges: Vec<Range> = answer
            .iter()
            .filter_map(|range| {
                let Value::Array(fields) = range else {
                    return None;
                };
                Some(Range {
                    start: redis::from_redis_value(fields.first()?).ok()?,
                    end: redis::from_redis_value(fields.get(1)?).ok()?,
                    primary: addr(fields.get(2)?)?,
                    replicas: fields.iter().skip(3).filter_map(addr).collect(),
                })
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        Self { ranges }
    }

    /// The primaries that serve slots, each once.
    pub(crate) fn primaries(&self) -> Vec<Addr> {
        let mut primaries: Vec<Addr> = Vec::new();
        for range in &self.ranges {
            if !primaries.contains(&range.primary) {
                primaries.push(range.primary.clone());
            }
        }
        primaries
    }

    /// Every node named, primaries first.
    fn nodes(&self) -> Vec<Addr> {
        let mut nodes = self.primaries();
        for replica in self.ranges.iter().flat_map(|r| &r.replicas) {
            if !nodes.contains(replica) {
                nodes.push(replica.clone());
            }
        }
        nodes
    }

    /// Whether both give every slot range the same primary (replicas may
    /// differ: a failover changes a primary).
    fn same_primaries(&self, other: &Self) -> bool {
        self.ranges.len() == other.ranges.len()
            && self
                .ranges
                .iter()
                .zip(&other.ranges)
                .all(|(a, b)| (a.start, a.end, &a.primary) == (b.start, b.end, &b.primary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut fields = vec![Value::Int(start), Value::Int(end)];
        fields.extend(nodes);
        Value::Array(fields)
    }

    #[test]
    fn a_promoted_replica_is_a_change_of_primaries() {
        let before = Layout::parse(
            vec![
                range(
                    5461,
                    16383,
                    vec![node("10.0.0.2", 7001), node("10.0.0.5", 7004)],
                ),
                range(
                    0,
                    5460,
                    vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
                ),
            ],
            "10.0.0.9",
        );
        assert_eq!(
            before.primaries(),
            vec![("10.0.0.1".into(), 7000), ("10.0.0.2".into(), 7001)],
            "ranges are read in slot order"
        );
        assert_eq!(before.nodes().len(), 4);

        // The failed primary is left out of the answer once its replica
        // took over.
        let after = Layout::parse(
            vec![
                range(0, 5460, vec![node("10.0.0.4", 7003)]),
                range(
                    5461,
                    16383,
                    vec![node("10.0.0.2", 7001), node("10.0.0.5", 7004)],
                ),
            ],
            "10.0.0.9",
        );
        assert!(!after.same_primaries(&before));

        // A replica that comes and goes is no failover.
        let replica_gone = Layout::parse(
            vec![
                range(0, 5460, vec![node("10.0.0.1", 7000)]),
                range(5461, 16383, vec![node("10.0.0.2", 7001)]),
            ],
            "10.0.0.9",
        );
        assert!(replica_gone.same_primaries(&before));
    }

    #[test]
    fn a_node_that_does_not_know_its_host_is_the_one_asked() {
        let layout = Layout::parse(vec![range(0, 16383, vec![node("", 7000)])], "127.0.0.1");
        assert_eq!(layout.primaries(), vec![("127.0.0.1".into(), 7000)]);
        assert_eq!(Layout::parse(vec![Value::Int(3)], "h"), Layout::default());
    }

    #[test]
    fn a_seed_without_a_port_is_on_the_default_one() -> Result<(), Box<dyn std::error::Error>> {
        let seed = |url: &str| -> Result<Option<Addr>, url::ParseError> {
            Ok(seed_addr(&Url::parse(url)?))
        };
        assert_eq!(seed("redis://h")?, Some(("h".into(), 6379)));
        assert_eq!(seed("rediss://u:p@h:7001/")?, Some(("h".into(), 7001)));
        assert_eq!(seed("redis://[::1]:7002")?, Some(("::1".into(), 7002)));
        Ok(())
    }

    #[test]
    fn node_urls_keep_the_seeds_scheme_credentials_and_options(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let seed = Url::parse("rediss://u:p@seed:7000/?protocol=resp3")?;
        let url = node_url(&seed, &("10.1.2.3".into(), 7005))?;
        assert_eq!(url.as_str(), "rediss://u:p@10.1.2.3:7005/?protocol=resp3");
        let v6 = node_url(&seed, &("::1".into(), 7005))?;
        assert_eq!(v6.host_str(), Some("[::1]"));
        Ok(())
    }
}
