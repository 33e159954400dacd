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
    cluster_async::ClusterConnection,
    cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr},
    Cmd, Pipeline, RedisFuture, RedisResult, Value,
};

use crate::sentinel::{SentinelMaster, SILENT_AFTER};

/// The two kinds of command connection.
#[derive(Clone)]
enum Kind {
    /// One server (or a proxy that routes by key).
    Single(ConnectionManager),
    /// A Redis Cluster; the client keeps a connection per node and routes
    /// each command by its key's slot.
    Cluster(ClusterConnection),
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

    pub(crate) fn cluster(conn: ClusterConnection, timeout: Duration) -> Self {
        Self {
            conn: Kind::Cluster(conn),
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

    /// Bounds `request` by the timeout; through Sentinel, an outcome that
    /// shows a failover starts a search for the master.
    fn bounded<'a, T: Send + 'a>(&self) -> impl FnOnce(RedisFuture<'a, T>) -> RedisFuture<'a, T> {
        let timeout = self.timeout;
        let master = match &self.conn {
            Kind::Sentinel(master) => Some(Arc::clone(master)),
            _ => None,
        };
        move |request| {
            async move {
                let request = tokio::time::timeout(timeout, request);
                let outcome: RedisResult<T> = match master {
                    None => request.await,
                    Some(master) => {
                        // A request that stalls may be dropped by its
                        // caller before it fails: look for the master now.
                        tokio::pin!(request);
                        let answer = tokio::select! {
                            biased;
                            answer = &mut request => answer,
                            () = tokio::time::sleep(SILENT_AFTER) => {
                                master.search_soon();
                                request.await
                            }
                        };
                        if let Ok(outcome) = &answer {
                            master.saw(outcome);
                        } else {
                            master.search_soon();
                        }
                        answer
                    }
                }
                .unwrap_or_else(|_| Err(timed_out(timeout)));
                outcome
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
        let mut primaries: Vec<(String, u16)> = Vec::new();
        for range in slots {
            // [start, end, [host, port, id, …], replicas…]
            let Value::Array(fields) = range else {
                continue;
            };
            let Some(Value::Array(primary)) = fields.get(2) else {
                continue;
            };
            let host: Option<String> = primary
                .first()
                .and_then(|v| redis::from_redis_value(v).ok());
            let port: Option<u16> = primary.get(1).and_then(|v| redis::from_redis_value(v).ok());
            if let (Some(host), Some(port)) = (host, port) {
                if !primaries.contains(&(host.clone(), port)) {
                    primaries.push((host, port));
                }
            }
        }
        Ok(primaries
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
            (Kind::Cluster(conn), None) => conn.req_packed_command(cmd),
            (Kind::Cluster(conn), Some(route)) => conn
                .route_command(cmd, RoutingInfo::SingleNode(route.clone()))
                .boxed(),
            (Kind::Sentinel(master), _) => {
                let (mut conn, moved) = master.manager_watched();
                moved.unless_moved(async move { conn.req_packed_command(cmd).await })
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
            (Kind::Cluster(conn), None) => conn.req_packed_commands(cmd, offset, count),
            (Kind::Cluster(conn), Some(route)) => conn
                .route_pipeline(cmd, offset, count, route.clone())
                .boxed(),
            (Kind::Sentinel(master), _) => {
                let (mut conn, moved) = master.manager_watched();
                moved
                    .unless_moved(async move { conn.req_packed_commands(cmd, offset, count).await })
            }
        };
        bounded(request)
    }

    fn get_db(&self) -> i64 {
        match &self.conn {
            Kind::Single(conn) => conn.get_db(),
            Kind::Cluster(_) => 0,
            Kind::Sentinel(master) => master.manager().get_db(),
        }
    }
}
