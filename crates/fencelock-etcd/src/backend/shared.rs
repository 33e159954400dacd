//! Read-write locks (`docs/rwlock.md`) on etcd: the readers' leases and
//! the writer intents that hold new readers back.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use fencelock_core::{
    Acquire, AcquireRequest, Error, Grant, LeaseId, LockKey, Owner, Result, WriteIntents,
};

use super::{secs, ttl_secs, wall_in, EtcdBackend, NEXT_READER};

impl EtcdBackend {
    pub(super) async fn acquire_reader(&self, request: &AcquireRequest) -> Result<Acquire> {
        let key = self.key(&request.key);
        let when = [
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(self.intent_key(&request.key), CompareOp::Equal, 0),
        ];
        let readers = self.readers_prefix(&request.key);
        // A name no other reader has: the shared lease's id is this
        // backend's alone, the counter this process's.
        let name = |lease: i64| {
            let n = NEXT_READER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{readers}{lease:x}-{n}")
        };
        let or_else = [TxnOp::get(key, None)];
        let refused = match self
            .put_grant(request, name, &when, &[], &or_else, false)
            .await?
        {
            Ok(grant) => return Ok(Acquire::Granted(grant)),
            Err(resp) => resp,
        };
        let writer = refused.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        let info = match &writer {
            Some(kv) => self.info(request.key.clone(), kv).await?,
            None => None,
        };
        Ok(Acquire::Held(info.map(|(i, _)| i)))
    }

    pub(super) async fn renew_reader(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        // Found by a range read each time (no cache of readers' keys); kept
        // on, or moved to, this backend's shared lease of the TTL.
        let ttl = ttl_secs(ttl);
        if let Some(kv) = self.reader(lease).await? {
            if let Some((_, granted)) = self.move_to_shared(&kv, ttl).await? {
                let granted = secs(granted);
                return Ok(Grant::new(lease.token, granted, wall_in(granted)));
            }
        }
        Err(Error::not_held(lease))
    }

    pub(super) async fn release_reader(&self, lease: &LeaseId) -> Result<()> {
        let deleted = match self.reader(lease).await? {
            Some(kv) => {
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                self.delete_grant(&full, lease.token).await?
            }
            None => false,
        };
        lease.found(deleted)
    }
}

#[async_trait]
impl WriteIntents for EtcdBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        // On the shared lease of the TTL, which lasts at least half of it
        // from now: posted every third of it while the writer waits, the
        // intent never lapses, and ends at most one TTL after the writer.
        let (lease, _) = self.shared_lease(ttl_secs(ttl)).await?;
        let intent = self.intent_key(key);
        let put = TxnOp::put(
            intent.clone(),
            owner.as_str(),
            Some(PutOptions::new().with_lease(lease.id)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                intent.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([put.clone()])
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([Compare::value(intent, CompareOp::Equal, owner.as_str())])
                    .and_then([put]),
            )]);
        self.txn("intent txn", txn).await.map(|_| ())
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let intent = self.intent_key(key);
        let txn = Txn::new()
            .when([Compare::value(
                intent.clone(),
                CompareOp::Equal,
                owner.as_str(),
            )])
            .and_then([TxnOp::delete(intent, None)]);
        self.txn("intent txn", txn).await.map(|_| ())
    }
}
