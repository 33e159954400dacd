//! FIFO waiting (`docs/fairness.md`): a waiting acquisition keeps its
//! sequential node, marked `queued`, between attempts instead of withdrawing
//! it. An attempt refreshes the node (its `mtime`, so the entry is a
//! lease of the request's TTL on the leader's clock) once a third of the TTL
//! has passed since the last write, and settles as a plain acquire does: granted once every older node is gone or expired (those
//! are deleted), which makes the lowest live node the next holder. The
//! grant is one more write, conditional on the node's version, that clears
//! the mark; the token stays the node's `czxid`.
//!
//! Tasks of one owner share an entry, so their attempts on one key take
//! turns (a lock per entry in this backend): two tasks that both found no
//! entry would otherwise each create one, and the one the backend forgot
//! would stand at the head of the queue, refreshed by nobody, for its whole
//! TTL. Not every attempt rewrites the entry either: a write is a change of
//! the node, which wakes every waiter watching it.

use fencelock_core::{Acquire, AcquireRequest, LockInfo, LockKey, LockMode, Owner, Result};
use std::sync::Arc;

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::{
    backend::{ttl_ms, Node, Record, ZkBackend},
    error::map,
};

/// A waiter's entry, by key directory and owner (tasks of one owner share
/// it).
type Place = (String, String);

/// A queue entry as this backend last wrote it, and when.
#[derive(Clone)]
pub(crate) struct Entry {
    node: Node,
    written: Instant,
}

/// The entry of one place, if any, behind the lock its attempts take turns
/// on.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Entry>>>;

impl ZkBackend {
    fn place(&self, key: &LockKey, owner: &Owner) -> Place {
        (self.key_dir(key.as_str()), owner.as_str().to_owned())
    }

    /// The slot of `place`, made if missing.
    fn slot(&self, place: &Place) -> Slot {
        Arc::clone(self.queued().entry(place.clone()).or_default())
    }

    /// Drops `place`'s slot once it is empty and no attempt waits on it.
    fn tidy(&self, place: &Place) {
        let mut queued = self.queued();
        if let Some(slot) = queued.get(place) {
            // The map's reference only: nobody else can fill it now.
            if Arc::strong_count(slot) == 1 && slot.try_lock().is_ok_and(|e| e.is_none()) {
                queued.remove(place);
            }
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Place, Slot>> {
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One attempt of a waiting acquisition (see the module docs).
    pub(crate) async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Acquire> {
        let place = self.place(&request.key, &request.owner);
        let slot = self.slot(&place);
        let answer = {
            let mut entry = slot.lock().await;
            self.attempt_in_turn(request, &mut entry).await
        };
        drop(slot);
        self.tidy(&place);
        answer
    }

    /// [`ZkBackend::try_acquire_queued`] with the place's turn: `entry` is
    /// what this backend last wrote for it.
    async fn attempt_in_turn(
        &self,
        request: &AcquireRequest,
        entry: &mut Option<Entry>,
    ) -> Result<Acquire> {
        let c = self.conn.client().await?;
        // In `layout=curator` at most what the session guarantees.
        let ttl = self.grantable(&c, request.ttl);
        let record = Record {
            owner: request.owner.to_string(),
            kind: request.kind.clone(),
            data: request.data.clone(),
            ttl_ms: ttl_ms(ttl),
            queued: true,
            foreign: false,
        };
        let bytes = record.to_bytes()?;
        let cached = entry.clone();
        let fresh = cached
            .as_ref()
            .filter(|e| e.written.elapsed() < ttl / 3 && e.node.record.ttl_ms == record.ttl_ms);
        let (mine, now) = match fresh {
            // Still a long lease left: judge the others on the clock node
            // instead of rewriting the entry.
            Some(entry) => (entry.node.clone(), self.now(&c).await?),
            None => {
                let mut refreshed = None;
                if let Some(entry) = cached {
                    // Conditional: a node deleted as expired, or granted to
                    // another task of this owner, is not ours to revive.
                    match self.write(&c, &entry.node, record.clone()).await? {
                        Ok(node) => refreshed = Some(node),
                        Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                        Err(e) => return Err(map("refreshing a queue entry", e)),
                    }
                }
                let mine = match refreshed {
                    Some(node) => node,
                    None => {
                        let key = request.key.as_str();
                        let (path, stat) =
                            self.create(&c, key, LockMode::Exclusive, &bytes).await?;
                        Node::created(path, record, stat)
                    }
                };
                *entry = Some(Entry {
                    node: mine.clone(),
                    written: Instant::now(),
                });
                // The write's `mtime` is "now" on the leader.
                let now = mine.written().mtime;
                (mine, now)
            }
        };
        if let Some(ahead) = self
            .settle(&c, &request.key, &request.owner, &mine.path, now)
            .await?
        {
            return Ok(Acquire::Held(Some(ahead)));
        }
        // Every older node is gone: take the lease. Conditional on the
        // version just written, so that a rival who judged this entry
        // expired and deleted it wins instead (and this write finds no
        // node), never both.
        let record = Record {
            queued: false,
            ..mine.record.clone()
        };
        match self.write_grant(&c, &mine, record).await? {
            Ok(granted) => {
                // The entry is a lease now.
                *entry = None;
                Ok(self.granted(request, granted))
            }
            // Deleted as expired, or rewritten by another process of this
            // owner: the next attempt queues anew.
            Err(zk::Error::NoNode | zk::Error::BadVersion) => {
                *entry = None;
                Ok(Acquire::Held(None))
            }
            Err(e) => Err(map("taking a lease from the queue", e)),
        }
    }

    /// Deletes `owner`'s entry on `key` if it is still as this backend
    /// last wrote it.
    pub(crate) async fn queue_leave(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let place = self.place(key, owner);
        let Some(slot) = self.queued().get(&place).cloned() else {
            return Ok(());
        };
        let left = {
            let mut entry = slot.lock().await;
            match entry.take() {
                Some(e) => match self.conn.client().await {
                    Ok(c) => self.delete(&c, &e.node).await.map(|_| ()),
                    Err(err) => Err(err),
                },
                None => Ok(()),
            }
        };
        drop(slot);
        self.tidy(&place);
        left
    }

    /// The live entries of `key`, oldest first; each entry's token is the
    /// node's `czxid`, the token it will be granted with.
    pub(crate) async fn queue_entries(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        self.nodes(&c, key.as_str())
            .await?
            .into_iter()
            .filter(|node| node.record.queued && node.live_at(now))
            .map(|node| node.info(key, now))
            .collect()
    }
}
