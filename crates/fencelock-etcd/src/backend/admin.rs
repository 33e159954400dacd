//! The operator's calls on etcd: listing, statistics, force-release and
//! cleanup.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use etcd_client::{Txn, TxnOp};
use fencelock_core::{BackendAdmin, LeaseId, LockInfo, LockKey, Owner, Result, Stats};

use super::{decode, token_of, EtcdBackend};

#[async_trait]
impl BackendAdmin for EtcdBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        Ok(self
            .scan(prefix)
            .await?
            .into_iter()
            .map(|(i, _)| i)
            .collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        // Readers and a writer's intent go too: the key is freed entirely.
        let reader = self.last_reader(key).await?;
        let readers = Txn::new().and_then([
            TxnOp::delete(
                self.readers_prefix(key),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ),
            TxnOp::delete(self.intent_key(key), None),
        ]);
        self.txn("force-release txn", readers).await?;
        let Some(kv) = self.get(key).await? else {
            return Ok(reader);
        };
        let info = self.info(key.clone(), &kv).await?;
        // Only this key: its lease may carry other grants. The holder's
        // next renewal finds the key gone.
        if info.is_some() && self.delete_grant(&self.key(key), token_of(&kv)).await? {
            return Ok(info.map(|(i, _)| i));
        }
        Ok(None)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let mut released = 0;
        let mut resp = self.range(self.locks_prefix()).await?;
        for kv in resp.take_kvs() {
            let Ok(stored) = decode(&kv) else { continue };
            if stored.owner != *owner {
                continue;
            }
            // Deleting only the incarnation read cannot touch a successor
            // that took the key since the range read.
            let full = String::from_utf8_lossy(kv.key()).into_owned();
            match self.user_key(&kv) {
                Some(key) if self.delete_grant(&full, token_of(&kv)).await? => {
                    self.forget(&LeaseId::new(key, owner.clone(), token_of(&kv)));
                    released += 1;
                }
                None if self.reader_user_key(&kv).is_some() => {
                    released += u64::from(self.delete_grant(&full, token_of(&kv)).await?);
                }
                _ => {}
            }
        }
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        // etcd deletes a key when its lease expires; there is nothing to do.
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats> {
        let leases = self.scan(None).await?;
        let now = Utc::now().timestamp_millis();
        let held = |acq: i64| Duration::from_millis(u64::try_from(now - acq).unwrap_or(0));
        Ok(Stats::from_leases(
            leases.iter().map(|(i, acq)| (i, held(*acq))),
            0,
        ))
    }
}
