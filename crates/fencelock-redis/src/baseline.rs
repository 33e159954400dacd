//! The raw baseline of `fencelock bench --baseline`: the backend's own
//! acquire and release scripts, sent as bare `EVALSHA` commands on one
//! multiplexed connection (the library also shares one; for a
//! `redis+cluster://` URL, on one cluster connection as the library's), with
//! the same keys and arguments, and none of the library around them. Not a
//! stable API.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    baseline::{RawBaseline, RawCycle, RAW_OWNER},
    LockKey, Result,
};
use redis::{aio::ConnectionLike, Value};

use crate::{
    backend::{client, from_value},
    cluster::cluster_connection,
    error::{bad_reply, map},
    keys::Keys,
    options::RedisOptions,
    scripts::Scripts,
};

/// Raw `EVALSHA` cycles on one shared connection (`C`: a multiplexed or a
/// cluster connection).
pub struct RedisBaseline<C> {
    conn: C,
    keys: Keys,
    acquire_sha: String,
    release_sha: String,
}

/// Connects as the backend for `url` does and loads its scripts.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let options = RedisOptions::from_url(url)?;
    if options.is_sentinel() {
        return Err(fencelock_core::Error::unsupported(
            "redis",
            "a raw baseline through Sentinel",
        ));
    }
    if options.is_cluster() {
        let conn = cluster_connection(&options.cluster_nodes, options.connect_timeout)
            .await
            .map_err(|e| map("cluster connect", e))?;
        return Ok(Box::new(RedisBaseline::loading(conn, &options).await?));
    }
    let conn = client(&options)?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| map("connect", e))?;
    Ok(Box::new(RedisBaseline::loading(conn, &options).await?))
}

impl<C: ConnectionLike> RedisBaseline<C> {
    /// Loads the two scripts through `conn` (on every primary of a
    /// cluster).
    async fn loading(mut conn: C, options: &RedisOptions) -> Result<Self> {
        let scripts = Scripts::new(options.plain);
        for script in [&scripts.acquire, &scripts.release] {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| map("SCRIPT LOAD", e))?;
        }
        Ok(Self {
            conn,
            keys: Keys::with_layout(&options.prefix, options.plain)?,
            acquire_sha: scripts.acquire.get_hash().to_owned(),
            release_sha: scripts.release.get_hash().to_owned(),
        })
    }
}

#[async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> RawBaseline for RedisBaseline<C> {
    fn describe(&self) -> String {
        "EVALSHA of the acquire script, then of the release script, on one multiplexed \
         connection"
            .into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            conn: self.conn.clone(),
            keys: self.keys.clone(),
            acquire_sha: self.acquire_sha.clone(),
            release_sha: self.release_sha.clone(),
        }))
    }
}

struct Worker<C> {
    conn: C,
    keys: Keys,
    acquire_sha: String,
    release_sha: String,
}

#[async_trait]
impl<C: ConnectionLike + Send + Sync> RawCycle for Worker<C> {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let key = LockKey::new(key)?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let row: Vec<Value> = redis::cmd("EVALSHA")
            .arg(&self.acquire_sha)
            .arg(5)
            .arg(self.keys.lease(&key))
            .arg(self.keys.counter(&key))
            .arg(self.keys.readers(&key))
            .arg(self.keys.readers_info(&key))
            .arg(self.keys.intent(&key))
            .arg(RAW_OWNER)
            .arg(ttl_ms)
            .arg("")
            .arg("")
            .arg("")
            .arg(self.keys.changes())
            .arg(key.as_str())
            .query_async(&mut self.conn)
            .await
            .map_err(|e| map("EVALSHA acquire", e))?;
        let mut row = row.into_iter();
        let granted: i64 = from_value(row.next())?;
        if granted != 1 {
            return Ok(None);
        }
        let token: String = from_value(row.next())?;
        token
            .parse()
            .map(Some)
            .map_err(|_| bad_reply(format!("token {token:?} is not a u64")))
    }

    async fn release(&mut self, key: &str, token: u64) -> Result<bool> {
        let key = LockKey::new(key)?;
        let removed: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(self.keys.lease(&key))
            .arg(RAW_OWNER)
            .arg(token.to_string())
            .arg(self.keys.channel(key.as_str()))
            .arg(key.as_str())
            .arg(self.keys.changes())
            .query_async(&mut self.conn)
            .await
            .map_err(|e| map("EVALSHA release", e))?;
        Ok(removed == 1)
    }
}
