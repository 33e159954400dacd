//! FIFO waiting (`docs/fairness.md`): each waiting acquisition keeps an
//! entry `P/locks/K\0q/<owner>` beside the lock key, ordered by its create
//! revision, and the lock is granted only to the oldest live entry, all in
//! the acquire Txn (`EtcdBackend::acquire_writers`).

use std::sync::PoisonError;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use fencelock_core::{AcquireRequest, FencingToken, LockInfo, LockKey, LockMode, Owner, Result};

use crate::backend::{ttl_secs, wall_in, EtcdBackend};

/// What follows a lock key in the keys of its queue entries.
pub(crate) const QUEUE: &str = "\0q/";

impl EtcdBackend {
    fn queue_prefix(&self, key: &LockKey) -> String {
        format!("{}{QUEUE}", self.key(key))
    }

    fn queue_entry(&self, key: &LockKey, owner: &Owner) -> String {
        format!("{}{}", self.queue_prefix(key), owner.as_str())
    }

    /// The compares that make it `request`'s turn: an empty queue, or, for
    /// a waiter whose place is known, its entry (at that create revision)
    /// being the oldest one. A single try thus never overtakes a waiter.
    pub(crate) fn queue_turn(&self, request: &AcquireRequest) -> Vec<Compare> {
        let prefix = self.queue_prefix(&request.key);
        let place = request.queue.then(|| {
            let entry = self.queue_entry(&request.key, &request.owner);
            let place = self.positions().get(&entry).copied();
            place.map(|place| (entry, place))
        });
        match place.flatten() {
            // A range compare holds when every key of the range satisfies
            // it: no entry was created before this one.
            Some((entry, place)) => vec![
                Compare::create_revision(prefix, CompareOp::Greater, place - 1).with_prefix(),
                Compare::create_revision(entry, CompareOp::Equal, place),
            ],
            None => vec![Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix()],
        }
    }

    /// What a grant of `request` also does: a waiter's entry leaves the
    /// queue with it.
    pub(crate) fn queue_on_grant(&self, request: &AcquireRequest) -> Option<TxnOp> {
        request
            .queue
            .then(|| TxnOp::delete(self.queue_entry(&request.key, &request.owner), None))
    }

    /// The refused branch's part for a waiter: its entry, put on the
    /// current queue lease unless it is already there (so that waking
    /// waiters do not rewrite their entries each time), then read back for
    /// its create revision. A put keeps an existing key's create revision,
    /// so moving to a newer lease keeps the waiter's place.
    ///
    /// Once the waiter has a place, only the entry at that place is
    /// refreshed, never put back: an attempt still on its way when its wait
    /// was dropped can reach etcd after the wait's `leave_queue`, and would
    /// otherwise leave an entry that holds up the next waiter until its
    /// lease ends. A waiter whose entry is gone (it expired) joins again,
    /// at the back, on its next attempt.
    pub(crate) async fn queue_refresh(&self, request: &AcquireRequest) -> Result<TxnOp> {
        let (lease, _) = self.queue_lease(ttl_secs(request.ttl)).await?;
        let entry = self.queue_entry(&request.key, &request.owner);
        let place = self.positions().get(&entry).copied();
        let get = TxnOp::get(entry.clone(), None);
        let put = TxnOp::put(
            entry.clone(),
            request.owner.as_str(),
            Some(PutOptions::new().with_lease(lease.id)),
        );
        let txn = match place {
            Some(place) => Txn::new()
                .when([
                    Compare::create_revision(entry.clone(), CompareOp::Equal, place),
                    Compare::lease(entry, CompareOp::NotEqual, lease.id),
                ])
                .and_then([put, get.clone()])
                .or_else([get]),
            None => Txn::new()
                .when([Compare::lease(entry, CompareOp::Equal, lease.id)])
                .and_then([get.clone()])
                .or_else([put, get]),
        };
        Ok(TxnOp::txn(txn))
    }

    /// Remembers the place `answer` (of [`Self::queue_refresh`]'s op) read.
    pub(crate) fn queue_noted(&self, request: &AcquireRequest, answer: TxnOpResponse) {
        let TxnOpResponse::Txn(nested) = answer else {
            return;
        };
        let place = nested.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        let entry = self.queue_entry(&request.key, &request.owner);
        let mut positions = self.positions();
        match place {
            Some(kv) => positions.insert(entry, kv.create_revision()),
            None => positions.remove(&entry),
        };
    }

    /// Forgets this backend's place on `key` for `owner` (granted or gone).
    pub(crate) fn queue_forget(&self, key: &LockKey, owner: &Owner) {
        let entry = self.queue_entry(key, owner);
        self.positions().remove(&entry);
    }

    fn positions(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i64>> {
        self.positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Deletes `owner`'s entry on `key` (tasks of one owner share it).
    pub(crate) async fn queue_leave(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.queue_forget(key, owner);
        let delete = Txn::new().and_then([TxnOp::delete(self.queue_entry(key, owner), None)]);
        self.txn("leave-queue txn", delete).await.map(|_| ())
    }

    /// The live entries of `key`, oldest first; an entry's token is its
    /// create revision and its expiry that of its lease.
    pub(crate) async fn queue_entries(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let prefix = self.queue_prefix(key);
        let mut resp = self.range(prefix).await?;
        let mut kvs = resp.take_kvs();
        kvs.sort_by_key(|kv| kv.create_revision());
        let lefts =
            futures_util::future::join_all(kvs.iter().map(|kv| self.remaining(kv.lease()))).await;
        let mut entries = Vec::with_capacity(kvs.len());
        for (kv, left) in kvs.iter().zip(lefts) {
            let Some(left) = left? else { continue };
            let Ok(owner) = Owner::new(String::from_utf8_lossy(kv.value()).into_owned()) else {
                continue;
            };
            let left = left.max(std::time::Duration::from_millis(1));
            entries.push(LockInfo {
                key: key.clone(),
                owner,
                token: FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0)),
                kind: None,
                data: None,
                // etcd keeps no time with a key: when it was read.
                acquired_at: chrono::Utc::now(),
                expires_at: wall_in(left),
                expires_in: left,
                mode: LockMode::Exclusive,
            });
        }
        Ok(entries)
    }
}
