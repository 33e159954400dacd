//! FIFO waiting (`docs/fairness.md`): a waiting acquisition keeps its
//! sequential node, marked `queued`, between attempts instead of withdrawing
//! it. An attempt refreshes the node (its `mtime`, so the entry is a
//! lease of the request's TTL on the leader's clock) once a third of the TTL
//! has passed since the last write, and settles as a plain acquire does:
//! granted once every older node is gone or expired (those are deleted),
//! which makes the lowest live node the next holder.
//!
//! The grant writes nothing: the entry already is a lease, and the oldest
//! live node holds the key whether or not its mark is cleared (the first
//! renewal clears it). So a waiter woken by the deletion of the node ahead
//! of it takes its turn on a read of the member it is connected to: in
//! another data centre than the leader, a hand-off costs the release's way
//! through the leader and no more (`docs/multi-dc.md`). That read is enough
//! when it shows no older node: sequence numbers only grow, the member has
//! applied at least this session's own creation of the entry, so every
//! older node it no longer lists is gone for good. The grant is trusted
//! from before the entry's last write was sent, not from this attempt
//! ([`ZkBackend::taken`]), and only for as long as that write's lease
//! lasts, so no rival can have judged the entry expired meanwhile. The
//! token stays the node's `czxid`.
//!
//! Tasks of one owner share an entry, so their attempts on one key take
//! turns (a lock per entry in this backend): two tasks that both found no
//! entry would otherwise each create one, and the one the backend forgot
//! would stand at the head of the queue, refreshed by nobody, for its whole
//! TTL. Not every attempt rewrites the entry either: a write is a change of
//! the node, which wakes every waiter watching it.

use fencelock_core::{Acquire, AcquireRequest, Grant, LockInfo, LockKey, LockMode, Owner, Result};
use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::{
    backend::{ms_to_time, shared, ttl_ms, Node, Record, Settled, ZkBackend},
    error::map,
};

/// A waiter's entry, by key directory and owner (tasks of one owner share
/// it).
type Place = (String, String);

/// A queue entry as this backend last wrote it, and when that write was
/// sent.
#[derive(Clone)]
pub(crate) struct Entry {
    node: Node,
    sent: Instant,
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
            .filter(|e| e.sent.elapsed() < ttl / 3 && e.node.record.ttl_ms == record.ttl_ms);
        let (mine, sent, now) = match fresh {
            Some(fresh) => {
                if let Some(answer) = self.turn_by_reading(&c, request, fresh).await? {
                    *entry = None;
                    return Ok(answer);
                }
                // Still a long lease left: judge the others on the clock
                // node instead of rewriting the entry.
                (fresh.node.clone(), fresh.sent, self.now(&c).await?)
            }
            None => {
                let sent = Instant::now();
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
                    sent,
                });
                // The write's `mtime` is "now" on the leader.
                let now = mine.written().mtime;
                (mine, sent, now)
            }
        };
        match self
            .settle(&c, &request.key, &request.owner, &mine.path, now)
            .await?
        {
            Settled::Behind(ahead) => return Ok(Acquire::Held(Some(ahead))),
            // Deleted: the next attempt queues anew.
            Settled::Gone => {
                *entry = None;
                return Ok(Acquire::Held(None));
            }
            Settled::First => {}
        }
        if !self.curator() {
            *entry = None;
            return Ok(self.taken(request, mine, sent));
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

    /// The grant `fresh`, this backend's entry, has become if the member
    /// this session reads from lists no node older than it, and no writer
    /// intent (which a grant withdraws, a write): no clock is needed to
    /// judge a lease that is not there (see the module docs). `Held(None)`
    /// when it no longer lists the entry (deleted as expired, or
    /// force-released): the next attempt queues anew. `None` when it lists
    /// an older node or an intent, and the attempt goes on as a full one.
    /// Only in fencelock's own layout: in Curator's the grant is a write,
    /// through the session that owns the entry.
    async fn turn_by_reading(
        &self,
        c: &zk::Client,
        request: &AcquireRequest,
        fresh: &Entry,
    ) -> Result<Option<Acquire>> {
        if self.curator() {
            return Ok(None);
        }
        let dir = self.key_dir(request.key.as_str());
        let (names, intent) = self.listing(c, &dir).await?;
        let own = fresh.node.path.rsplit('/').next().unwrap_or_default();
        if !names.iter().any(|name| name == own) {
            return Ok(Some(Acquire::Held(None)));
        }
        let first = names.first().is_some_and(|name| name == own);
        Ok((first && !intent).then(|| self.taken(request, fresh.node.clone(), fresh.sent)))
    }

    /// `mine`, a queue entry last written by a request sent at `sent` and
    /// now the oldest live node of its key, as the grant it is. Nothing is
    /// written, so the lease is the one that write made: it is granted for
    /// what is left of it, counted twice over (the core counts the grant
    /// from this attempt's send, and takes the margin of its clock policy
    /// off the length it is given: twice the age keeps the local deadline
    /// before the one the write itself would have had, for any clock drift
    /// up to 40 %). The first renewal, at a third of that, writes a full
    /// lease again.
    fn taken(&self, request: &AcquireRequest, mine: Node, sent: Instant) -> Acquire {
        let token = mine.token();
        let written = Duration::from_millis(mine.record.ttl_ms);
        let ttl = written.saturating_sub(sent.elapsed() * 2);
        let grant = Grant::new(token, ttl, ms_to_time(mine.expires_ms()));
        self.remember(&request.lease(token), mine);
        Acquire::Granted(grant)
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

    /// The live entries of `key` that do not hold it, oldest first; each
    /// entry's token is the node's `czxid`, the token it will be granted
    /// with. An entry at the head of the queue holds the key before its
    /// waiter has taken it (see the module docs).
    pub(crate) async fn queue_entries(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let live: Vec<Node> = self
            .nodes(&c, key.as_str())
            .await?
            .into_iter()
            .filter(|node| node.live_at(now))
            .collect();
        let holding: Vec<String> = shared::holders(live.clone())
            .into_iter()
            .map(|node| node.path)
            .collect();
        live.into_iter()
            .filter(|node| node.record.queued && !holding.contains(&node.path))
            .map(|node| node.info(key, now))
            .collect()
    }
}
