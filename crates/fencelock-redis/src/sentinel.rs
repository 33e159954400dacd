//! The master of a `redis+sentinel://` URL: found by asking the Sentinels,
//! and found again after a failover.
//!
//! The command connection is a connection manager to the master of the
//! moment. A request that fails as a failover makes requests fail (the
//! master unreachable, or answering `READONLY` because it was turned into a
//! replica) fails as a transient error, as on one server, and starts one
//! search for the master; so does a request left without an answer for
//! [`SILENT_AFTER`] (a dead master's requests wait for the connection
//! manager's reconnection attempts, and a caller's own deadline may drop
//! them before they fail). A search asks the Sentinels every [`ASK_EVERY`]
//! until they name a server that answers as master: while they judge the
//! old master (down-after, then their election) they keep naming it, or
//! name none. When they name another server, later requests go there, a
//! fraction of a second after the Sentinels' switch rather than whenever
//! the next request happens to fail.
//!
//! Opening asks the same way, for up to the `connect_timeout`: a client
//! started during a failover waits for it instead of failing. Tokens stay above every
//! token the old master issued (I2) for the reason they do after a Redis
//! Cluster failover: the acquire script draws no token below the server's
//! clock in microseconds (`draw` in `scripts.rs`), whatever the promoted
//! replica's counter had caught up with.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::time::Instant;

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    sentinel::{Sentinel, SentinelNodeConnectionInfo},
    Client, ConnectionAddr, ErrorKind, RedisError, RedisResult,
};

use crate::{error::map, options::RedisOptions};

/// A request without an answer this long starts a search: Redis answers in
/// well under a millisecond.
pub(crate) const SILENT_AFTER: Duration = Duration::from_millis(250);
/// How often a search asks the Sentinels again.
const ASK_EVERY: Duration = Duration::from_millis(100);
/// Bound on one question: a Sentinel, then `ROLE` at the server it names
/// (a stopped server accepts connections and never answers).
const ASK_WITHIN: Duration = Duration::from_millis(500);
/// A search that finds no master for this long ends; the next request that
/// fails or stalls starts another.
const SEARCH_FOR: Duration = Duration::from_secs(60);

/// See the module docs.
pub(crate) struct SentinelMaster {
    sentinel: tokio::sync::Mutex<Sentinel>,
    name: String,
    node: SentinelNodeConnectionInfo,
    config: ConnectionManagerConfig,
    current: Mutex<Current>,
    /// Counts the masters followed; a request waiting on the one before
    /// sees it change.
    moves: tokio::sync::watch::Sender<u64>,
    /// A search is under way: the errors of the requests in flight to the
    /// old master start no other.
    searching: AtomicBool,
}

#[derive(Clone)]
struct Current {
    client: Client,
    manager: ConnectionManager,
}

impl fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SentinelMaster {
    /// Asks the Sentinels of `options` for the master and connects to it.
    pub(crate) async fn connect(
        options: &RedisOptions,
        config: ConnectionManagerConfig,
    ) -> fencelock_core::Result<Arc<Self>> {
        let name = options
            .master_name
            .clone()
            .ok_or_else(|| crate::error::bad_reply("not a redis+sentinel:// URL"))?;
        let sentinels: Vec<&str> = options.sentinels.iter().map(url::Url::as_str).collect();
        let sentinel = Sentinel::build(sentinels).map_err(|e| {
            fencelock_core::Error::InvalidUrl(format!(
                "the redis driver refused a Sentinel URL ({:?})",
                e.kind()
            ))
        })?;
        let data = super::backend::client(options)?
            .get_connection_info()
            .clone();
        let node = SentinelNodeConnectionInfo {
            tls_mode: match data.addr {
                ConnectionAddr::TcpTls { insecure, .. } => Some(if insecure {
                    redis::TlsMode::Insecure
                } else {
                    redis::TlsMode::Secure
                }),
                _ => None,
            },
            redis_connection_info: Some(data.redis),
        };
        let sentinel = tokio::sync::Mutex::new(sentinel);
        // Leaves the last question time to end inside the caller's bound.
        let until = Instant::now() + options.connect_timeout.saturating_sub(ASK_WITHIN);
        let client = loop {
            match ask(&sentinel, &name, &node).await {
                Ok(client) => break client,
                Err(e) if Instant::now() + ASK_EVERY >= until => {
                    return Err(map(&format!("asking the Sentinels for master {name:?}"), e))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "sentinel: no master yet; asking again");
                    tokio::time::sleep(ASK_EVERY).await;
                }
            }
        };
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(|e| map("connect", e))?;
        Ok(Arc::new(Self {
            sentinel,
            name,
            node,
            config,
            current: Mutex::new(Current { client, manager }),
            moves: tokio::sync::watch::Sender::new(0),
            searching: AtomicBool::new(false),
        }))
    }

    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to the master as last found.
    pub(crate) fn manager(&self) -> ConnectionManager {
        self.current().manager
    }

    /// [`SentinelMaster::manager`], and what ends a request sent on it once
    /// another master is followed.
    pub(crate) fn manager_watched(&self) -> (ConnectionManager, Moved) {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        (current.manager.clone(), Moved(self.moves.subscribe()))
    }

    /// A client of the master as last found (for pub/sub).
    pub(crate) fn client(&self) -> Client {
        self.current().client
    }

    /// Looks at a request's outcome: an error that a failover causes starts
    /// a search for the master in the background (bounded by the caller's
    /// runtime only; the requests themselves stay bounded by their timeout).
    pub(crate) fn saw<T>(self: &Arc<Self>, outcome: &RedisResult<T>) {
        if let Err(e) = outcome {
            if after_failover(e) {
                self.search_soon();
            }
        }
    }

    /// Starts a search in the background unless one is under way.
    pub(crate) fn search_soon(self: &Arc<Self>) {
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let master = Arc::clone(self);
        tokio::spawn(async move {
            master.search().await;
            master.searching.store(false, Ordering::Release);
        });
    }

    /// Asks the Sentinels until they name a master that answers; connects
    /// to it when it is not the one in use.
    async fn search(&self) {
        let until = Instant::now() + SEARCH_FOR;
        loop {
            match ask(&self.sentinel, &self.name, &self.node).await {
                Ok(client)
                    if client.get_connection_info().addr
                        == self.current().client.get_connection_info().addr =>
                {
                    // The master in use answers as master: whatever made
                    // the request fail or stall, it was no failover.
                    return;
                }
                Ok(client) => {
                    match ConnectionManager::new_with_config(client.clone(), self.config.clone())
                        .await
                    {
                        Ok(manager) => {
                            tracing::info!(master = %self.name, addr = %client.get_connection_info().addr, "sentinel: following the new master");
                            let mut current =
                                self.current.lock().unwrap_or_else(PoisonError::into_inner);
                            *current = Current { client, manager };
                            self.moves.send_modify(|n| *n += 1);
                            return;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "sentinel: the new master did not answer");
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sentinel: no master that answers yet"),
            }
            if Instant::now() >= until {
                tracing::warn!(master = %self.name, "sentinel: no master found in {SEARCH_FOR:?}; asking again when a request fails");
                return;
            }
            tokio::time::sleep(ASK_EVERY).await;
        }
    }
}

/// Ends a request to a master that is no longer followed.
///
/// A request to a dead master waits for the connection manager's
/// reconnection attempts until its time-out; once the Sentinels have named
/// another master there is nothing to wait for. It fails then, as a
/// transient error, and its caller retries on the new master at once
/// instead of a time-out later. (Whether the old master ran it is unknown,
/// as after any time-out.)
pub(crate) struct Moved(tokio::sync::watch::Receiver<u64>);

impl Moved {
    /// `request`, unless another master is followed first.
    pub(crate) fn unless_moved<'a, T: Send + 'a>(
        mut self,
        request: impl std::future::Future<Output = RedisResult<T>> + Send + 'a,
    ) -> redis::RedisFuture<'a, T> {
        Box::pin(async move {
            tokio::select! {
                biased;
                answer = request => answer,
                Ok(()) = self.0.changed() => Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the Sentinels named another master while the request waited for this one",
                )
                .into()),
            }
        })
    }
}

/// Asks the Sentinels which server is master `name` and checks that it
/// answers as one, within [`ASK_WITHIN`].
async fn ask(
    sentinel: &tokio::sync::Mutex<Sentinel>,
    name: &str,
    node: &SentinelNodeConnectionInfo,
) -> RedisResult<Client> {
    let asking = async {
        let mut sentinel = sentinel.lock().await;
        sentinel.async_master_for(name, Some(node)).await
    };
    tokio::time::timeout(ASK_WITHIN, asking)
        .await
        .unwrap_or_else(|_| Err(crate::conn::timed_out(ASK_WITHIN)))
}

/// Whether `e` is how a failover shows: the master unreachable or silent,
/// or turned replica.
fn after_failover(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::ReadOnly
}
