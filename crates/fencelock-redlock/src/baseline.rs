//! `fencelock bench --baseline` for `redlock://`: what antirez's Redlock
//! sends, with no token and no quarantine: `SET key value NX PX ttl` on
//! every node at once, granted iff a majority answered OK, then `DEL` on
//! every node at once. What fencelock adds on top (the scripts' checks and
//! token, the lease layout, the guard) is what the ratio measures.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use async_trait::async_trait;
use fencelock_core::{
    baseline::{RawBaseline, RawCycle, RAW_OWNER},
    LockKey, Result,
};
use fencelock_redis::{
    node::{map_error, ttl_ms, BoundedConnection, Keys},
    RedisBackend,
};
use futures_util::future::join_all;

use crate::options::RedlockOptions;

struct Raw {
    nodes: Vec<(BoundedConnection, Keys)>,
    quorum: usize,
}

/// Opens one connection per node (all must answer).
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let options = RedlockOptions::from_url(url)?;
    let mut nodes = Vec::new();
    for node in &options.nodes {
        let backend = RedisBackend::connect_with(node.clone()).await?;
        nodes.push((backend.connection(), backend.keys().clone()));
    }
    Ok(Box::new(Raw {
        nodes,
        quorum: options.quorum(),
    }))
}

#[async_trait]
impl RawBaseline for Raw {
    fn describe(&self) -> String {
        format!(
            "SET NX PX on all {} nodes at once (granted on a majority), then DEL on all",
            self.nodes.len()
        )
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            nodes: self.nodes.clone(),
            quorum: self.quorum,
        }))
    }
}

struct Worker {
    nodes: Vec<(BoundedConnection, Keys)>,
    quorum: usize,
}

/// Raw Redlock has no token: a local count stands in for one.
static COUNT: AtomicU64 = AtomicU64::new(0);

#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let key = LockKey::new(key)?;
        let ttl = ttl_ms(ttl);
        let answers = join_all(self.nodes.iter_mut().map(|(conn, keys)| {
            let name = keys.lease(&key).to_string();
            async move {
                redis::cmd("SET")
                    .arg(name)
                    .arg(RAW_OWNER)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<Option<String>>(conn)
                    .await
            }
        }))
        .await;
        let granted = answers
            .into_iter()
            .filter(|a| matches!(a, Ok(Some(_))))
            .count();
        if granted >= self.quorum {
            Ok(Some(COUNT.fetch_add(1, Ordering::Relaxed) + 1))
        } else {
            self.release(key.as_str(), 0).await?;
            Ok(None)
        }
    }

    async fn release(&mut self, key: &str, _token: u64) -> Result<bool> {
        let key = LockKey::new(key)?;
        let answers = join_all(self.nodes.iter_mut().map(|(conn, keys)| {
            let name = keys.lease(&key).to_string();
            async move { redis::cmd("DEL").arg(name).query_async::<i64>(conn).await }
        }))
        .await;
        let mut removed = 0;
        for answer in answers {
            removed += answer.map_err(|e| map_error("DEL", e))?;
        }
        Ok(removed as usize >= self.quorum)
    }
}
