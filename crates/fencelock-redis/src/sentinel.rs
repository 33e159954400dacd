//! The master of a `redis+sentinel://` URL: found by asking the Sentinels,
//! and found again after a failover.
//!
//! The command connection is a connection manager to the master of the
//! moment. A request that fails as a failover makes requests fail (the
//! master unreachable or silent, or answering `READONLY` because it was
//! turned into a replica) fails as a transient error, as on one server, and
//! starts one search for the master: the Sentinels are asked, and when they
//! name another server, later requests go there. Tokens stay above every
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
};

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    sentinel::{Sentinel, SentinelNodeConnectionInfo},
    Client, ConnectionAddr, ErrorKind, RedisError, RedisResult,
};

use crate::{error::map, options::RedisOptions};

/// See the module docs.
pub(crate) struct SentinelMaster {
    sentinel: tokio::sync::Mutex<Sentinel>,
    name: String,
    node: SentinelNodeConnectionInfo,
    config: ConnectionManagerConfig,
    current: Mutex<Current>,
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
        let mut sentinel = Sentinel::build(sentinels).map_err(|e| {
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
        let client = sentinel
            .async_master_for(&name, Some(&node))
            .await
            .map_err(|e| map("sentinel", e))?;
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(|e| map("connect", e))?;
        Ok(Arc::new(Self {
            sentinel: tokio::sync::Mutex::new(sentinel),
            name,
            node,
            config,
            current: Mutex::new(Current { client, manager }),
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

    /// A client of the master as last found (for pub/sub).
    pub(crate) fn client(&self) -> Client {
        self.current().client
    }

    /// Looks at a request's outcome: an error that a failover causes starts
    /// a search for the master in the background (bounded by the caller's
    /// runtime only; the requests themselves stay bounded by their timeout).
    pub(crate) fn saw<T>(self: &Arc<Self>, outcome: &RedisResult<T>) {
        let Err(e) = outcome else { return };
        if !after_failover(e) || self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let master = Arc::clone(self);
        tokio::spawn(async move {
            master.search().await;
            master.searching.store(false, Ordering::Release);
        });
    }

    /// Asks the Sentinels for the master; connects to it when it is not
    /// the one in use.
    async fn search(&self) {
        let found = {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.name, Some(&self.node))
                .await
        };
        let client = match found {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(error = %e, "sentinel: no master found");
                return;
            }
        };
        if client.get_connection_info().addr == self.current().client.get_connection_info().addr {
            return;
        }
        match ConnectionManager::new_with_config(client.clone(), self.config.clone()).await {
            Ok(manager) => {
                tracing::info!(master = %self.name, addr = %client.get_connection_info().addr, "sentinel: following the new master");
                *self.current.lock().unwrap_or_else(PoisonError::into_inner) =
                    Current { client, manager };
            }
            Err(e) => tracing::debug!(error = %e, "sentinel: the new master did not answer"),
        }
    }
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
