//! FIFO waiting (`docs/fairness.md`): a waiting acquisition keeps its
//! sequential node, marked `queued`, between attempts instead of withdrawing
//! it. Each attempt refreshes the node (its `mtime`, so the entry is a
//! lease of the request's TTL on the leader's clock) and settles as a plain
//! acquire does: granted once every older node is gone or expired (those
//! are deleted), which makes the lowest live node the next holder. The
//! grant is one more write, conditional on the node's version, that clears
//! the mark; the token stays the node's `czxid`.

use fencelock_core::{
    Acquire, AcquireRequest, FencingToken, Grant, LockInfo, LockKey, Owner, Result,
};
use zookeeper_client as zk;

use crate::{
    backend::{ms_to_time, ttl_ms, Node, Record, ZkBackend},
    error::{bad_value, map},
};

/// A waiter's entry, by key directory and owner (tasks of one owner share
/// it).
type Place = (String, String);

impl ZkBackend {
    fn place(&self, key: &LockKey, owner: &Owner) -> Place {
        (self.key_dir(key.as_str()), owner.as_str().to_owned())
    }

    fn queued_node(&self, place: &Place) -> Option<Node> {
        self.queued().get(place).cloned()
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Place, Node>> {
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One attempt of a waiting acquisition (see the module docs).
    pub(crate) async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Acquire> {
        let c = self.conn.client().await?;
        let record = Record {
            owner: request.owner.to_string(),
            kind: request.kind.clone(),
            data: request.data.clone(),
            ttl_ms: ttl_ms(request.ttl),
            queued: true,
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| bad_value(e.to_string()))?;
        let place = self.place(&request.key, &request.owner);
        let mut refreshed = None;
        if let Some(node) = self.queued_node(&place) {
            // Conditional: a node deleted as expired, or granted to another
            // task of this owner, is not ours to revive.
            match self
                .conn
                .raw(c.set_data(&node.path, &bytes, Some(node.stat.version)))
                .await
            {
                Ok(stat) => refreshed = Some((node.path, stat)),
                Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                Err(e) => return Err(map("refreshing a queue entry", e)),
            }
        }
        let (path, stat) = match refreshed {
            Some(found) => found,
            None => self.create(&c, &place.0, &bytes).await?,
        };
        let mine = Node { path, record, stat };
        self.queued().insert(place.clone(), mine.clone());
        // The write's `mtime` is "now" on the leader.
        if let Some(ahead) = self
            .settle(&c, &request.key, &mine.path, mine.stat.mtime)
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
        let bytes = serde_json::to_vec(&record).map_err(|e| bad_value(e.to_string()))?;
        let answer = self
            .conn
            .raw(c.set_data(&mine.path, &bytes, Some(mine.stat.version)))
            .await;
        self.queued().remove(&place);
        match answer {
            Ok(stat) => {
                let token = FencingToken(u64::try_from(stat.czxid).unwrap_or(0));
                let node = Node {
                    path: mine.path,
                    record,
                    stat,
                };
                let grant = Grant::new(token, request.ttl, ms_to_time(node.expires_ms()));
                self.remember(&request.lease(token), node);
                Ok(Acquire::Granted(grant))
            }
            // The entry is gone or was rewritten: the next attempt queues
            // anew.
            Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(Acquire::Held(None)),
            Err(e) => Err(map("taking a lease from the queue", e)),
        }
    }

    /// Deletes `owner`'s entry on `key` if it is still as this backend
    /// last wrote it.
    pub(crate) async fn queue_leave(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let place = self.place(key, owner);
        let Some(node) = self.queued().remove(&place) else {
            return Ok(());
        };
        let c = self.conn.client().await?;
        self.delete(&c, &node).await.map(|_| ())
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
