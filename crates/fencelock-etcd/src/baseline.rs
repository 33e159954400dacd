//! The raw baseline of `fencelock bench --baseline`: the least a lock cycle
//! costs in etcd, a put-if-absent Txn (`create_revision == 0` → put, else
//! get) and a Delete, with raw `etcd-client` calls on one client (the
//! library also shares one gRPC channel), connected with the backend's
//! options. No lease: the library attaches keys to a lease shared by the
//! grants of one TTL, which costs no extra request per lock cycle (see
//! `docs/etcd.md`). Not a stable API.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use fencelock_core::{
    baseline::{RawBaseline, RawCycle},
    Result,
};

use crate::{backend::connect, error::map, options::EtcdOptions, prefer::Steward};

/// Raw Txn + Delete cycles on one shared client.
pub struct EtcdBaseline {
    client: Client,
    _steward: Option<Steward>,
    prefix: String,
}

/// Connects as the backend for `url` does.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let options = EtcdOptions::from_url(url)?;
    let (client, steward) = connect(&options).await?;
    Ok(Box::new(EtcdBaseline {
        client,
        _steward: steward,
        // Apart from the library's lock keys, so neither sees the other's.
        prefix: format!("{}/bench-raw/", options.prefix),
    }))
}

#[async_trait]
impl RawBaseline for EtcdBaseline {
    fn describe(&self) -> String {
        "a put-if-absent Txn, then a Delete, on one etcd client (no lease)".into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
        }))
    }
}

struct Worker {
    client: Client,
    prefix: String,
}

#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, _ttl: Duration) -> Result<Option<u64>> {
        let key = format!("{}{key}", self.prefix);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), "raw", None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .client
            .txn(txn)
            .await
            .map_err(|e| map("put-if-absent txn", e))?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok(u64::try_from(revision).ok())
    }

    async fn release(&mut self, key: &str, _token: u64) -> Result<bool> {
        let resp = self
            .client
            .delete(format!("{}{key}", self.prefix), None)
            .await
            .map_err(|e| map("delete", e))?;
        Ok(resp.deleted() > 0)
    }
}
