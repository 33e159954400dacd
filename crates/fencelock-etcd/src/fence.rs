//! [`EtcdFence`]: the I7 fence as a compare-and-swap Txn.

use std::fmt;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use fencelock_core::{Admission, Fence, FenceRecord, FencedValue, FencingToken, LockMode, Result};

use crate::{
    backend::connect,
    error::{bad_value, failover, map},
    options::EtcdOptions,
    prefer::Steward,
};

/// A fence in etcd: one key per resource (`PREFIX/fences/RESOURCE`) holding
/// the highest admitted token, followed by `/W` when the highest admitted
/// writer token `W` is lower (read-write locks, `docs/rwlock.md`; a record
/// without it, as every record from before, is a writer's). Admission reads the record and raises it with
/// a Txn that compares the record's mod revision, retrying on a concurrent
/// change (tokens are compared as numbers in Rust, not as bytes in etcd).
/// A fenced value is a key of its own (`PREFIX/fence_values/RESOURCE`: the
/// writer's token in decimal, a newline, the value's bytes), put by the same
/// Txn that raises the record. A reset deletes both keys with a Txn under
/// the same comparison.
#[derive(Clone)]
pub struct EtcdFence {
    client: Client,
    _steward: Option<Steward>,
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
        let (client, steward) = connect(&options).await?;
        Ok(Self {
            client,
            _steward: steward,
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

    fn value_key(&self, resource: &str) -> String {
        format!("{}/fence_values/{resource}", self.options.prefix)
    }

    /// Admits `token` held in `mode` and, with `value`, stores it in the
    /// same Txn.
    async fn admit_with(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
        value: Option<&[u8]>,
    ) -> Result<Admission> {
        let key = self.key(resource);
        let value = value.map(|v| {
            let stored = FencedValue::new(token, v.to_vec()).to_record();
            (self.value_key(resource), stored)
        });
        loop {
            let (current, revision) = self.read(&key).await?;
            let next = match FenceRecord::admit(current, token, mode) {
                Ok(next) => next,
                Err(floor) => return Ok(Admission::Stale { current: floor }),
            };
            if current == Some(next) && value.is_none() {
                return Ok(Admission::Admitted);
            }
            let mut ops = vec![TxnOp::put(key.clone(), next.to_string(), None)];
            if let Some((value_key, stored)) = &value {
                ops.push(TxnOp::put(value_key.clone(), stored.clone(), None));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then(ops);
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

    /// The current record: (highest token and highest writer token, mod
    /// revision; 0 when absent).
    async fn read(&self, key: &str) -> Result<(Option<FenceRecord>, i64)> {
        let mut resp = failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), key.to_owned());
            async move { c.get(k, None).await }
        })
        .await
        .map_err(|e| map("fence get", e))?;
        match resp.take_kvs().into_iter().next() {
            None => Ok((None, 0)),
            Some(kv) => {
                let record = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(FenceRecord::parse)
                    .ok_or_else(|| bad_value("fence record is not a u64"))?;
                Ok((Some(record), kv.mod_revision()))
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
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let (record, _) = self.read(&self.key(resource)).await?;
        Ok(record.and_then(|r| r.writer()))
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        self.admit_with(resource, token, mode, None).await
    }

    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        self.admit_with(resource, token, LockMode::Exclusive, Some(value))
            .await
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let key = self.value_key(resource);
        let mut resp = failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), key.clone());
            async move { c.get(k, None).await }
        })
        .await
        .map_err(|e| map("fenced value get", e))?;
        let Some(kv) = resp.take_kvs().into_iter().next() else {
            return Ok(None);
        };
        FencedValue::from_record(kv.value())
            .map(Some)
            .ok_or_else(|| bad_value("fenced value does not start with its token"))
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let (key, value_key) = (self.key(resource), self.value_key(resource));
        loop {
            let (current, revision) = self.read(&key).await?;
            let Some(record) = current else {
                return Ok(None);
            };
            // The record's mod revision orders this delete with every
            // admission, as it orders admissions among themselves; a value
            // is only ever put by a Txn that also raises the record, so it
            // cannot change unseen either.
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([
                    TxnOp::delete(key.clone(), None),
                    TxnOp::delete(value_key.clone(), None),
                ]);
            let resp = failover(self.options.timeout, || {
                let (mut c, t) = (self.client.clone(), txn.clone());
                async move { c.txn(t).await }
            })
            .await
            .map_err(|e| map("fence reset txn", e))?;
            if resp.succeeded() {
                return Ok(Some(record.highest()));
            }
            // An admission (or another reset) changed the record between
            // our read and the delete: read it again.
        }
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let (record, _) = self.read(&self.key(resource)).await?;
        Ok(record.map(|r| r.highest()))
    }
}
