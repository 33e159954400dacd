//! The master of a `redis+sentinel://` URL: found by asking the Sentinels,
//! and found again after a failover.
//!
//! The command connection is a connection manager to the master of the
//! moment, followed as [`crate::follow`] says: a search asks the Sentinels
//! until they name a server that answers as master. While they judge the
//! old master (down-after, then their election) they keep naming it, or
//! name none; when they name another server, later requests go there, a
//! fraction of a second after the Sentinels' switch rather than whenever
//! the next request happens to fail.
//!
//! Opening asks the same way, for up to the `connect_timeout`: a client
//! started during a failover waits for it instead of failing. Tokens stay
//! above every token the old master issued (I2) for the reason they do
//! after a Redis Cluster failover: the acquire script draws no token below
//! the server's clock in microseconds (`draw` in `scripts.rs`), whatever
//! the promoted replica's counter had caught up with.

use std::{fmt, sync::Arc};

use tokio::time::Instant;

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    sentinel::{Sentinel, SentinelNodeConnectionInfo},
    Client, ConnectionAddr, RedisResult,
};

use crate::{
    error::map,
    follow::{Follower, Source, ASK_EVERY, ASK_WITHIN},
    options::RedisOptions,
};

/// The master of a `redis+sentinel://` URL, followed through failovers.
pub(crate) type SentinelMaster = Follower<Sentinels>;

/// The Sentinels of a URL, and how to connect to the master they name.
pub(crate) struct Sentinels {
    sentinel: tokio::sync::Mutex<Sentinel>,
    name: String,
    node: SentinelNodeConnectionInfo,
    config: ConnectionManagerConfig,
}

/// The master as last found.
#[derive(Clone)]
pub(crate) struct Current {
    client: Client,
    /// The connection requests go on.
    pub(crate) manager: ConnectionManager,
}

impl fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinels")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Sentinels {
    /// Asks the Sentinels of `options` for the master and connects to it.
    pub(crate) async fn connect(
        options: &RedisOptions,
        config: ConnectionManagerConfig,
    ) -> fencelock_core::Result<Arc<SentinelMaster>> {
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
        let sentinels = Self {
            sentinel,
            name,
            node,
            config,
        };
        Ok(Follower::new(sentinels, Current { client, manager }))
    }
}

impl Follower<Sentinels> {
    /// A client of the master as last found (for pub/sub).
    pub(crate) fn client(&self) -> Client {
        self.current().client
    }
}

impl Source for Sentinels {
    type Conn = Current;

    fn what(&self) -> String {
        format!("sentinel master {:?}", self.name)
    }

    /// Asks the Sentinels for a master that answers as one: while they
    /// judge the old one they keep naming it, or name none.
    async fn ask(&self, current: &Current) -> RedisResult<Option<Current>> {
        let client = ask(&self.sentinel, &self.name, &self.node).await?;
        if client.get_connection_info().addr == current.client.get_connection_info().addr {
            return Ok(None);
        }
        let manager =
            ConnectionManager::new_with_config(client.clone(), self.config.clone()).await?;
        Ok(Some(Current { client, manager }))
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
