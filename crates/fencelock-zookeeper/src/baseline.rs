//! The raw baseline of `fencelock bench --baseline`: the least a lock cycle
//! costs in ZooKeeper, a create of the key's node (`NodeExists` = held)
//! and a delete, with raw `zookeeper-client` calls on one session,
//! connected with the backend's options. The backend's own cycle also reads
//! the key's older lease nodes in the acquire and touches the node in the
//! release (`docs/zookeeper.md`). Not a stable API.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    baseline::{RawBaseline, RawCycle},
    Result,
};
use zookeeper_client as zk;

use crate::{conn::Conn, error::map, options::ZkOptions};

/// Raw create + delete cycles on one session.
pub struct ZkBaseline {
    client: zk::Client,
    dir: String,
}

/// Connects as the backend for `url` does.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let conn = Conn::open(ZkOptions::from_url(url)?).await?;
    let client = conn.client().await?;
    // Apart from the library's lock nodes, so neither sees the other's.
    let dir = format!("{}/bench-raw", conn.options.base());
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client
        .mkdir(&dir, &persistent)
        .await
        .map_err(|e| map("creating the raw baseline's directory", e))?;
    Ok(Box::new(ZkBaseline { client, dir }))
}

#[async_trait]
impl RawBaseline for ZkBaseline {
    fn describe(&self) -> String {
        "a create of the key's node (taken if it exists), then a delete, on one ZooKeeper session"
            .into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            client: self.client.clone(),
            dir: self.dir.clone(),
        }))
    }
}

struct Worker {
    client: zk::Client,
    dir: String,
}

impl Worker {
    fn path(&self, key: &str) -> String {
        format!("{}/{}", self.dir, crate::conn::encode(key))
    }
}

#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, _ttl: Duration) -> Result<Option<u64>> {
        let node = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        match self.client.create(&self.path(key), b"raw", &node).await {
            Ok((stat, _)) => Ok(u64::try_from(stat.czxid).ok()),
            Err(zk::Error::NodeExists) => Ok(None),
            Err(e) => Err(map("create", e)),
        }
    }

    async fn release(&mut self, key: &str, _token: u64) -> Result<bool> {
        match self.client.delete(&self.path(key), None).await {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map("delete", e)),
        }
    }
}
