//! [`EtcdFence`]: the I7 fence as a compare-and-swap Txn.

use std::fmt;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use fencelock_core::{Admission, Fence, FencingToken, Result};

use crate::{
    backend::connect,
    error::{bad_value, failover, map},
    options::EtcdOptions,
};

/// A fence in etcd: one key per resource (`PREFIX/fences/RESOURCE`) holding
/// the highest admitted token. Admission reads the record and raises it with
/// a Txn that compares the record's mod revision, retrying on a concurrent
/// change (tokens are compared as numbers in Rust, not as bytes in etcd).
#[derive(Clone)]
pub struct EtcdFence {
    client: Client,
    options: EtcdOptions,
}

impl fmt::Debug for EtcdFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFence")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl EtcdFence {
    /// Connects with `options`.
    pub async fn connect_with(options: EtcdOptions) -> Result<Self> {
        Ok(Self {
            client: connect(&options).await?,
            options,
        })
    }

    /// Connects to `url` (see [`EtcdOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(EtcdOptions::from_url(url)?).await
    }

    fn key(&self, resource: &str) -> String {
        format!("{}/fences/{resource}", self.options.prefix)
    }

    /// The current record: (highest token, mod revision; 0 when absent).
    async fn read(&self, key: &str) -> Result<(Option<FencingToken>, i64)> {
        let mut resp = failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), key.to_owned());
            async move { c.get(k, None).await }
        })
        .await
        .map_err(|e| map("fence get", e))?;
        match resp.take_kvs().into_iter().next() {
            None => Ok((None, 0)),
            Some(kv) => {
                let token = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| bad_value("fence record is not a u64"))?;
                Ok((Some(FencingToken(token)), kv.mod_revision()))
            }
        }
    }
}

#[async_trait]
impl Fence for EtcdFence {
    fn name(&self) -> &'static str {
        "etcd"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        let key = self.key(resource);
        loop {
            let (current, revision) = self.read(&key).await?;
            match current {
                Some(current) if current > token => return Ok(Admission::Stale { current }),
                Some(current) if current == token => return Ok(Admission::Admitted),
                _ => {}
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(key.clone(), token.0.to_string(), None)]);
            let resp = failover(self.options.timeout, || {
                let (mut c, t) = (self.client.clone(), txn.clone());
                async move { c.txn(t).await }
            })
            .await
            .map_err(|e| map("fence txn", e))?;
            if resp.succeeded() {
                return Ok(Admission::Admitted);
            }
            // Someone else changed the record between our read and write:
            // read it again and decide afresh.
        }
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.read(&self.key(resource)).await?.0)
    }
}
