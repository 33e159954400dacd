//! Read-write locks (`docs/rwlock.md`) on the lease-node layout.
//!
//! A reader's lease is a sibling of the writers' nodes, `r-0000000042`
//! beside `l-…`, in the same sequence (the parent's counter numbers every
//! sequential child), with the same record, expiry and token (its
//! `czxid`, so readers' and writers' tokens compare). A waiting writer's
//! intent is one plain node, `intent`, holding its owner and TTL; it
//! expires like a lease (`mtime` + TTL on the leader's clock).
//!
//! Why the create-then-check decision excludes readers and writers: a
//! writer is granted only if every node older than its own is expired
//! (readers' included), a reader only if every *writer* node older than
//! its own is. Take a reader R and a writer W that both decide to hold:
//! their nodes have distinct sequence numbers, say R's is lower. The
//! sequence is the parent's counter, so R's create was committed before
//! W's, and W lists the children after its own create on the same
//! session: ZooKeeper serves a session's reads at a state no older than
//! its own writes, so W's listing contains R's node unless R had already
//! deleted it (then R no longer holds). W read it unexpired at W's `ctime`
//! (R's lease is at least as young), or failed to delete it because it was
//! renewed: W refuses. The other order is the same argument with the
//! roles swapped. Readers never look at each other's nodes, so they
//! share. A contender of either side that is refused deletes its node, so
//! it blocks the other side for one round trip at most, and for its TTL if
//! it dies in between (as for writers alone).
//!
//! The intent is not a safety matter (a reader admitted beside an intent
//! still excludes the writer): it only stops new readers, so a waiting
//! writer is not starved. A reader checks it twice: before creating its
//! node, so that readers refused by a live intent never leave a node that
//! would block the writer it serves, and after, so that an intent posted
//! while it created its node still stops it.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Error, LockInfo, LockKey, LockMode, Owner, Result, WriteIntents,
};
use zookeeper_client as zk;

use super::{seq, ttl_ms, Node, Record, ZkBackend, NODE};
use crate::error::{bad_value, map};

/// The name of a key's writer intent node.
pub(super) const INTENT: &str = "intent";

/// How often an intent write is tried again when the node changed between
/// its read and its write (other writers posting or withdrawing).
const INTENT_TRIES: usize = 5;

/// The holders among the unexpired `live` nodes of one key, oldest first:
/// the oldest if it is a writer's, else every reader older than the first
/// writer's node. A younger reader is a contender about to see the writer
/// and withdraw, and so is a writer younger than a reader. A waiter's
/// queue entry (`queue.rs`) is a writer's node like any other: at the
/// head it holds the key, taken or not yet by its waiter, and behind it
/// it stops younger readers.
pub(crate) fn holders(live: Vec<Node>) -> Vec<Node> {
    match live.first().map(Node::mode) {
        Some(LockMode::Exclusive) => live.into_iter().take(1).collect(),
        _ => live
            .into_iter()
            .take_while(|node| node.mode() == LockMode::Shared)
            .collect(),
    }
}

impl ZkBackend {
    fn intent_path(&self, key: &LockKey) -> String {
        format!("{}/{INTENT}", self.key_dir(key.as_str()))
    }

    /// The intent node of `dir`, if any.
    async fn read_intent(&self, c: &zk::Client, dir: &str) -> Result<Option<Node>> {
        self.read(c, format!("{dir}/{INTENT}")).await
    }

    /// Whether `intent` still stops readers at `now`; an expired one is
    /// deleted (conditional on its version: one refreshed since it was
    /// read is live again).
    async fn intent_stops(&self, c: &zk::Client, intent: &Node, now: i64) -> Result<bool> {
        Ok(intent.live_at(now) || !self.delete(c, intent).await?)
    }

    /// A reader's acquisition (a shared [`fencelock_core::Backend::try_acquire`]).
    pub(super) async fn acquire_reader(&self, request: &AcquireRequest) -> Result<Acquire> {
        if request.min_token.is_some() {
            return Err(Error::unsupported(crate::error::NAME, "token floors"));
        }
        let c = self.conn.client().await?;
        let dir = self.key_dir(request.key.as_str());
        if let Some(intent) = self.read_intent(&c, &dir).await? {
            let now = self.now(&c).await?;
            if self.intent_stops(&c, &intent, now).await? {
                return Ok(Acquire::Held(None));
            }
        }
        let record = Record {
            owner: request.owner.to_string(),
            kind: request.kind.clone(),
            data: request.data.clone(),
            ttl_ms: ttl_ms(request.ttl),
            queued: false,
            foreign: false,
        };
        let bytes = record.to_bytes()?;
        let key = request.key.as_str();
        let (mine, stat) = self.create(&c, key, LockMode::Shared, &bytes).await?;
        match self
            .settle_reader(&c, &request.key, &mine, stat.ctime)
            .await
        {
            Ok(None) => Ok(self.granted(request, Node::created(mine, record, stat))),
            outcome => {
                // As for a refused writer: the node must not stand in the
                // way of the next writer; if even this fails it expires.
                let _ = c.delete(&mine, None).await;
                outcome.map(|refused| Acquire::Held(refused.flatten()))
            }
        }
    }

    /// After creating the reader node `mine` at `now`: `None` when granted
    /// (every older writer's node has expired, and no live intent), else
    /// `Some` with the writer that holds the key, if one does.
    async fn settle_reader(
        &self,
        c: &zk::Client,
        key: &LockKey,
        mine: &str,
        now: i64,
    ) -> Result<Option<Option<LockInfo>>> {
        let dir = self.key_dir(key.as_str());
        let own = mine.rsplit('/').next().unwrap_or_default();
        let (mut older, intent) = self.listing(c, &dir).await?;
        older.retain(|name| name.starts_with(NODE) && seq(name) < seq(own));
        if let Some(writer) = self.first_live(c, key, older, now).await? {
            return Ok(Some(Some(writer)));
        }
        if intent {
            if let Some(intent) = self.read_intent(c, &dir).await? {
                if self.intent_stops(c, &intent, now).await? {
                    return Ok(Some(None));
                }
            }
        }
        Ok(None)
    }

    /// `post_write_intent`: creates the intent, refreshes `owner`'s, or
    /// replaces an expired one; another owner's live intent stays.
    pub(super) async fn post_intent(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<()> {
        let c = self.conn.client().await?;
        let dir = self.key_dir(key.as_str());
        let path = self.intent_path(key);
        let record = Record {
            owner: owner.to_string(),
            kind: None,
            data: None,
            ttl_ms: ttl_ms(ttl),
            queued: false,
            foreign: false,
        };
        let bytes = record.to_bytes()?;
        let plain = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        for _ in 0..INTENT_TRIES {
            // Every write below is conditional on what was read, so two
            // writers posting at once cannot both believe theirs stands
            // when only one does; the loser reads again.
            let written = match self.read_intent(&c, &dir).await? {
                None => self
                    .conn
                    .raw(c.create(&path, &bytes, &plain))
                    .await
                    .map(|_| ()),
                Some(intent) => {
                    if intent.record.owner != owner.as_str() {
                        let now = self.now(&c).await?;
                        if intent.live_at(now) {
                            return Ok(());
                        }
                    }
                    // A write moves `mtime`: the intent is refreshed.
                    self.conn
                        .raw(c.set_data(&path, &bytes, Some(intent.stat.version)))
                        .await
                        .map(|_| ())
                }
            };
            match written {
                Ok(()) => return Ok(()),
                // The key's container was reaped (no lease left in it).
                Err(zk::Error::NoNode) => self.ensure_dir(&c, &dir).await?,
                Err(zk::Error::NodeExists | zk::Error::BadVersion) => {}
                Err(e) => return Err(map("posting a writer intent", e)),
            }
        }
        Err(bad_value(format!(
            "{path} changed {INTENT_TRIES} times while a writer intent was posted"
        )))
    }

    /// Deletes `owner`'s intent in `dir`, if it has one (a writer granted
    /// or giving up).
    pub(super) async fn withdraw_intent(
        &self,
        c: &zk::Client,
        dir: &str,
        owner: &Owner,
    ) -> Result<()> {
        for _ in 0..INTENT_TRIES {
            let Some(intent) = self.read_intent(c, dir).await? else {
                return Ok(());
            };
            if intent.record.owner != owner.as_str() {
                return Ok(());
            }
            match self
                .conn
                .raw(c.delete(&intent.path, Some(intent.stat.version)))
                .await
            {
                Ok(()) | Err(zk::Error::NoNode) => return Ok(()),
                // Refreshed meanwhile (a task of the same owner): again.
                Err(zk::Error::BadVersion) => {}
                Err(e) => return Err(map("withdrawing a writer intent", e)),
            }
        }
        Err(bad_value(format!(
            "{dir}/{INTENT} changed {INTENT_TRIES} times while a writer intent was withdrawn"
        )))
    }

    /// `force_release`: deletes every lease node of `key` (writer,
    /// readers, contenders, expired ones) and the intent, and reports the
    /// writer that held it, else the reader with the highest token.
    pub(super) async fn free_key(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let nodes = self.nodes(&c, key.as_str()).await?;
        if let Some(foreign) = nodes.iter().find(|n| n.record.foreign) {
            // fencelock deletes only the nodes it created: a Curator or
            // kazoo client still believes in its own.
            return Err(Error::Unsupported(format!(
                "force-releasing {key:?}: {} ({}) is a Curator or kazoo contender, \
                 and fencelock deletes only the nodes it created",
                foreign.path, foreign.record.owner
            )));
        }
        let live = nodes.iter().filter(|n| n.live_at(now)).cloned().collect();
        let reported = holders(live)
            .into_iter()
            .max_by_key(|n| (n.mode() == LockMode::Exclusive, n.token()));
        let intent = self.intent_path(key);
        // Unconditional, sent together on the one session: whatever was
        // renewed since the read goes too, the key is freed entirely.
        let leases =
            futures_util::future::join_all(nodes.iter().map(|n| self.remove(&c, n, false)));
        let (leases, intent) =
            futures_util::future::join(leases, self.conn.raw(c.delete(&intent, None))).await;
        for answer in leases.into_iter().chain([intent]) {
            match answer {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map("force-releasing a lease", e)),
            }
        }
        reported.map(|n| n.info(key, now)).transpose()
    }
}

#[async_trait]
impl WriteIntents for ZkBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        self.refuse_shared()?;
        self.post_intent(key, owner, ttl).await
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        self.refuse_shared()?;
        let c = self.conn.client().await?;
        self.withdraw_intent(&c, &self.key_dir(key.as_str()), owner)
            .await
    }
}
