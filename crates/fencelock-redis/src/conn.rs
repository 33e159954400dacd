//! The command connection — to one server or to a Redis Cluster — every
//! command bounded by the `timeout` option.
//!
//! The connection manager's response timeout covers a command on a live
//! connection, but a command issued while the manager reconnects waits for
//! the reconnection, which retries with backoff and can take several
//! timeouts. Bounding each request here keeps every operation, whatever the
//! manager (or the cluster client, which retries redirections and refreshes
//! its slot map) is doing, within the timeout.
//!
//! Both kinds of connection run the same scripts: every script touches the
//! keys of one lock, which share a hash tag and so a slot, and the cluster
//! client routes an `EVALSHA` by its first key. What differs is spelled out
//! here: the admin scans visit every primary ([`BoundedConnection::primaries`])
//! and `WAIT` goes to the primary of the slot written
//! ([`BoundedConnection::for_slot`]).

use std::{io, sync::Arc, time::Duration};

use futures_util::FutureExt;
use redis::{
    aio::{ConnectionLike, ConnectionManager},
    cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr},
    Cmd, Pipeline, RedisFuture, Value,
};

use crate::{
    cluster::{ClusterFollower, Layout},
    follow::{watching, Searches},
    sentinel::SentinelMaster,
};

/// The three kinds of command connection.
#[derive(Clone)]
enum Kind {
    /// One server (or a proxy that routes by key).
    Single(ConnectionManager),
    /// A Redis Cluster; the client keeps a connection per node and routes
    /// each command by its key's slot. Followed through failovers.
    Cluster(Arc<ClusterFollower>),
    /// The master a set of Sentinels names, followed through failovers.
    Sentinel(Arc<SentinelMaster>),
}

/// A command connection whose requests fail with a timeout error (a
/// transient one, see `crate::error::map`) after `timeout`. Cheap to clone.
#[derive(Clone)]
pub struct BoundedConnection {
    conn: Kind,
    timeout: Duration,
    /// Cluster only: where every request goes instead of where its key
    /// routes it (one primary during a scan; a slot's primary for `WAIT`).
    route: Option<SingleNodeRoutingInfo>,
}

impl BoundedConnection {
    /// Bounds every request of `conn` by `timeout`.
    pub fn new(conn: ConnectionManager, timeout: Duration) -> Self {
        Self {
            conn: Kind::Single(conn),
            timeout,
            route: None,
        }
    }

    pub(crate) fn cluster(cluster: Arc<ClusterFollower>, timeout: Duration) -> Self {
        Self {
            conn: Kind::Cluster(cluster),
            timeout,
            route: None,
        }
    }

    pub(crate) fn sentinel(master: Arc<SentinelMaster>, timeout: Duration) -> Self {
        Self {
            conn: Kind::Sentinel(master),
            timeout,
            route: None,
        }
    }

    /// Bounds `request` by the timeout; through Sentinel or in a cluster,
    /// an outcome that shows a failover starts a search for where requests
    /// go now ([`crate::follow`]).
    fn bounded<'a, T: Send + 'a>(&self) -> impl FnOnce(RedisFuture<'a, T>) -> RedisFuture<'a, T> {
        let timeout = self.timeout;
        let follower: Option<Arc<dyn Searches>> = match &self.conn {
            Kind::Single(_) => None,
            Kind::Cluster(cluster) => Some(Arc::clone(cluster) as Arc<dyn Searches>),
            Kind::Sentinel(master) => Some(Arc::clone(master) as Arc<dyn Searches>),
        };
        move |request| {
            async move {
                match follower {
                    None => tokio::time::timeout(timeout, request).await.ok(),
                    Some(follower) => watching(follower, timeout, request).await,
                }
                .unwrap_or_else(|| Err(timed_out(timeout)))
            }
            .boxed()
        }
    }

    /// Whether this is a Redis Cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Kind::Cluster(_))
    }

    /// The same connection, its requests bounded by `timeout` instead.
    pub(crate) fn bounded_by(&self, timeout: Duration) -> Self {
        Self {
            timeout,
            ..self.clone()
        }
    }

    /// The same connection, its requests allowed `extra` time on top: for a
    /// command that waits on the server by design (`WAIT`).
    pub(crate) fn allowing(&self, extra: Duration) -> Self {
        Self {
            timeout: self.timeout.saturating_add(extra),
            ..self.clone()
        }
    }

    /// The same connection with every request sent to the primary of
    /// `slot` (in a cluster; unchanged otherwise). `WAIT` counts the
    /// replicas that acknowledged this client's writes *on the node it is
    /// sent to*, so it must go where the script wrote; left to the cluster
    /// client, it would go to every primary and wait for the slowest.
    pub(crate) fn for_slot(&self, slot: u16) -> Self {
        let mut routed = self.clone();
        if routed.is_cluster() {
            routed.route = Some(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
        }
        routed
    }

    /// One connection per primary: the connection itself for a single
    /// server; for a cluster, one routed to each primary that serves slots
    /// (read from `CLUSTER SLOTS` now, so a recent failover is seen). `SCAN`
    /// walks the keys of one node, so the admin calls scan each of these.
    pub(crate) async fn primaries(&self) -> redis::RedisResult<Vec<Self>> {
        if !self.is_cluster() {
            return Ok(vec![self.clone()]);
        }
        let mut any = self.clone();
        any.route = Some(SingleNodeRoutingInfo::Random);
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut any)
            .await?;
        Ok(Layout::parse(slots, "")
            .primaries()
            .into_iter()
            .map(|(host, port)| {
                let mut routed = self.clone();
                routed.route = Some(SingleNodeRoutingInfo::ByAddress { host, port });
                routed
            })
            .collect())
    }
}

/// The error of a request that did not answer within `timeout`.
pub(crate) fn timed_out(timeout: Duration) -> redis::RedisError {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("redis did not answer within {timeout:?}"),
    )
    .into()
}

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let bounded = self.bounded();
        let request = match (&mut self.conn, &self.route) {
            (Kind::Single(conn), _) => conn.req_packed_command(cmd),
            (Kind::Cluster(cluster), route) => {
                let (mut current, moved) = cluster.watched();
                let route = route.clone();
                moved.unless_moved(async move {
                    match route {
                        None => current.conn.req_packed_command(cmd).await,
                        Some(route) => {
                            current
                                .conn
                                .route_command(cmd, RoutingInfo::SingleNode(route))
                                .await
                        }
                    }
                })
            }
            (Kind::Sentinel(master), _) => {
                let (mut current, moved) = master.watched();
                moved.unless_moved(async move { current.manager.req_packed_command(cmd).await })
            }
        };
        bounded(request)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let bounded = self.bounded();
        let request = match (&mut self.conn, &self.route) {
            (Kind::Single(conn), _) => conn.req_packed_commands(cmd, offset, count),
            (Kind::Cluster(cluster), route) => {
                let (mut current, moved) = cluster.watched();
                let route = route.clone();
                moved.unless_moved(async move {
                    match route {
                        None => current.conn.req_packed_commands(cmd, offset, count).await,
                        Some(route) => current.conn.route_pipeline(cmd, offset, count, route).await,
                    }
                })
            }
            (Kind::Sentinel(master), _) => {
                let (mut current, moved) = master.watched();
                moved.unless_moved(async move {
                    current
                        .manager
                        .req_packed_commands(cmd, offset, count)
                        .await
                })
            }
        };
        bounded(request)
    }

    fn get_db(&self) -> i64 {
        match &self.conn {
            Kind::Single(conn) => conn.get_db(),
            Kind::Cluster(_) => 0,
            Kind::Sentinel(master) => master.current().manager.get_db(),
        }
    }
}
