//! [`ZkBackend`]: the `Backend` implementation.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, ChangeFeed, Error, FencingToken, Grant,
    LeaseId, LockInfo, LockKey, LockMode, Owner, Renewal, Result, WakeSubscription, WriteIntents,
};
use serde::{Deserialize, Serialize};

use zookeeper_client as zk;

use crate::{
    conn::{decode, encode, Conn},
    error::{bad_value, map},
    options::{ZkLayout, ZkOptions},
};

mod admin;
mod queue;

pub(crate) mod shared;

/// The name every exclusive lease node starts with; ZooKeeper appends the
/// sequence.
pub(crate) const NODE: &str = "l-";

/// The name every reader's lease node starts with (`shared.rs`). Readers
/// and writers are siblings numbered by the key's one sequence counter.
pub(crate) const READER: &str = "r-";

/// The prefix of `mode`'s lease nodes.
fn prefix(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Exclusive => NODE,
        LockMode::Shared => READER,
    }
}

/// The name of the marker a fair waiter's grant created and deleted in the
/// same multi op as the write that made its queue entry the lease, before
/// such grants wrote nothing (`queue.rs`); no read ever saw it. The change
/// watch still names its key (`changes.rs`), for a store shared with
/// processes of those versions.
pub(crate) const GRANTED: &str = "g-";

/// The sequence part of a lease node's name: both prefixes are two bytes,
/// and the ten-digit numbers share the parent's counter, so comparing
/// them orders readers and writers by creation. In the Curator layout,
/// the digits after the recipe's marker (`curator.rs`).
fn seq(name: &str) -> &str {
    crate::curator::sequence(name).unwrap_or_else(|| name.get(NODE.len()..).unwrap_or_default())
}

/// The child that held the lease record of a fencelock contender node
/// once the lease had been written after its creation, when those nodes
/// were persistent (Curator layout, before they became ephemeral). Such
/// nodes are still read, renewed and deleted with their child
/// (`docs/zookeeper.md`).
const LEASE: &str = "lease";

/// What ends the name of the node in `BASE/leases` that holds the lease
/// record of an ephemeral contender once the lease has been written after
/// its creation (Curator layout); the rest of the name is the contender's
/// path, escaped as keys are. The contender node itself is never written
/// after it is created: the recipes that queue behind it watch its data,
/// and Curator's `LeaderLatch` re-checks only when it is deleted and drops
/// its watch when it changes. An ephemeral node can have no child, and a
/// sibling would be sorted among the contenders by Curator, so the record
/// lives in a tree no recipe lists. `~` is escaped in the path part, so
/// the name never ends in a sequence and is never taken for a contender.
const SIDE: &str = "~lease";

/// The data of a contender node of fencelock's in the Curator layout: the
/// record as created, wrapped so that a fencelock from before these nodes
/// were ephemeral reads it as a foreign contender (held until deleted)
/// rather than judge it by its creation record alone, which would be a
/// lease long expired once it was renewed in its side node.
#[derive(Serialize, Deserialize)]
struct Contender {
    fencelock: Record,
}

/// The TTL a release's touch shortens its lease to (`release_as`). No grant
/// or renewal asks for less than the core's minimum TTL (100 ms), so a
/// record with this TTL is a lease being released: readers count it gone
/// already. Otherwise a read between the touch and the delete would report
/// a lease that ends within milliseconds, and an observer that then finds
/// it gone would take the resignation for an expiry.
const RELEASING: Duration = Duration::from_millis(1);

/// Past this many cached leases, the ones that ended long ago (lost, never
/// released here) are swept out.
const CACHE_SWEEP: usize = 4096;

/// What a lease node stores. Its expiry is not stored: it is the node's
/// `mtime` (the leader's clock when the grant or the last renewal was
/// written) plus `ttl_ms`, so a renewal is one conditional write.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<serde_json::Value>,
    pub(crate) ttl_ms: u64,
    /// A waiter's queue entry (`queue.rs`), until the first renewal after
    /// its grant: not a holder's node unless it is the oldest live one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) queued: bool,
    /// Not fencelock's: a Curator or kazoo contender (Curator layout), held
    /// until its node is deleted; the rest of the record describes it.
    #[serde(skip)]
    pub(crate) foreign: bool,
}

impl Record {
    /// The bytes a lease node stores.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| bad_value(e.to_string()))
    }
}

/// Where [`ZkBackend::settle`] found a node it had just written.
pub(crate) enum Settled {
    /// The oldest live node of its key: its lease holds the key.
    First,
    /// Behind an older live node, whose lease this is.
    Behind(LockInfo),
    /// Gone since it was written: deleted by a force-release (or as
    /// expired, had its write taken longer than its lease).
    Gone,
}

/// A lease node as read: its path, record and stat.
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) path: String,
    /// The lease record as last written: the [`LEASE`] child's once it
    /// exists, else the node's own.
    pub(crate) record: Record,
    /// The node's stat: its `czxid` is the token, its `ctime` when it was
    /// acquired.
    pub(crate) stat: zk::Stat,
    /// The stat of the node holding its lease record once written since
    /// its creation (Curator layout): its side node in `BASE/leases`, or
    /// the [`LEASE`] child of a persistent node of an older fencelock.
    pub(crate) lease: Option<zk::Stat>,
}

impl Node {
    /// A node just created with `record`.
    pub(crate) fn created(path: String, record: Record, stat: zk::Stat) -> Self {
        Self {
            path,
            record,
            stat,
            lease: None,
        }
    }

    /// The stat of the lease record's last write, whose `mtime` the expiry
    /// counts from and whose version the next write is conditional on.
    pub(crate) fn written(&self) -> &zk::Stat {
        self.lease.as_ref().unwrap_or(&self.stat)
    }

    /// Whether the node is ephemeral: in the Curator layout, a contender
    /// whose record, once written, is in its side node.
    fn ephemeral(&self) -> bool {
        self.stat.ephemeral_owner != 0
    }

    pub(crate) fn expires_ms(&self) -> i64 {
        self.written()
            .mtime
            .saturating_add(i64::try_from(self.record.ttl_ms).unwrap_or(i64::MAX))
    }

    /// Whether the lease is unexpired at `now` (milliseconds on the
    /// leader's clock) and not being released. A foreign node is live
    /// until it is deleted.
    pub(crate) fn live_at(&self, now: i64) -> bool {
        self.record.foreign || (self.expires_ms() > now && self.record.ttl_ms != ttl_ms(RELEASING))
    }

    /// Whether this node is a writer's or a reader's lease.
    fn mode(&self) -> LockMode {
        let name = self.path.rsplit('/').next().unwrap_or_default();
        if name.starts_with(READER) {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        }
    }

    pub(crate) fn token(&self) -> FencingToken {
        // Zxids are positive; a negative one is not a node this crate wrote.
        FencingToken(u64::try_from(self.stat.czxid).unwrap_or(0))
    }

    pub(crate) fn info(&self, key: &LockKey, now: i64) -> Result<LockInfo> {
        // A foreign holder has no lease: reported as ending one session
        // timeout (its `ttl_ms`) from now, the soonest its node could go
        // if its client died now.
        let expires = match self.record.foreign {
            true => now.saturating_add(i64::try_from(self.record.ttl_ms).unwrap_or(i64::MAX)),
            false => self.expires_ms(),
        };
        Ok(LockInfo {
            key: key.clone(),
            owner: Owner::new(self.record.owner.clone())
                .map_err(|_| bad_value(format!("{}: bad owner", self.path)))?,
            token: self.token(),
            kind: self.record.kind.clone(),
            data: self.record.data.clone(),
            acquired_at: ms_to_time(self.stat.ctime),
            expires_at: ms_to_time(expires),
            expires_in: Duration::from_millis(u64::try_from(expires - now).unwrap_or(0)),
            mode: self.mode(),
        })
    }
}

pub(crate) fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// A ZooKeeper lock store (see the crate docs and `docs/zookeeper.md`).
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) conn: Arc<Conn>,
    /// The nodes of leases this backend granted or renewed, as last
    /// written, so that renew and release are one conditional write
    /// without finding the node first. A stale entry costs a failed
    /// write and a lookup, never a wrong answer: every write is
    /// conditional on the version cached.
    cache: Arc<Mutex<HashMap<LeaseId, Node>>>,
    /// Queue entries of this backend's waiters, as last written
    /// (`queue.rs`).
    pub(crate) queued: Arc<Mutex<HashMap<(String, String), crate::queue::Slot>>>,
    /// The store's change feeds and their one watch (`changes.rs`).
    pub(crate) changes: Arc<fencelock_core::WatchedHub>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("options", &self.conn.options)
            .finish()
    }
}

impl ZkBackend {
    /// Connects with `options`.
    pub async fn connect_with(options: ZkOptions) -> Result<Self> {
        Ok(Self {
            conn: Arc::new(Conn::open(options).await?),
            cache: Arc::default(),
            queued: Arc::default(),
            changes: Arc::default(),
        })
    }

    /// Connects to `url` (see [`ZkOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(ZkOptions::from_url(url)?).await
    }

    pub(crate) fn key_dir(&self, key: &str) -> String {
        match self.conn.options.layout {
            ZkLayout::Curator => crate::curator::key_dir(&self.conn.options.chroot, key)
                // No Curator client can name this path either.
                .unwrap_or_else(|| format!("{}/{}", self.conn.locks_dir(), encode(key))),
            _ => format!("{}/{}", self.conn.locks_dir(), encode(key)),
        }
    }

    pub(crate) fn curator(&self) -> bool {
        self.conn.options.layout == ZkLayout::Curator
    }

    /// The node in `BASE/leases` that holds the lease record of the
    /// ephemeral contender at `path` once written (Curator layout).
    fn side_path(&self, path: &str) -> String {
        format!("{}/{}{SIDE}", self.conn.leases_dir(), encode(path))
    }

    /// Where the lease record of `node` goes once written after its
    /// creation: its side node if it is ephemeral, else (a persistent node
    /// of an older fencelock) its [`LEASE`] child.
    fn lease_path(&self, node: &Node) -> String {
        match node.ephemeral() {
            true => self.side_path(&node.path),
            false => format!("{}/{LEASE}", node.path),
        }
    }

    /// The TTL this backend grants for a request of `ttl`. In the Curator
    /// layout a lease lives in an ephemeral node, which the server deletes
    /// when it expires the session, so a grant may be trusted only as long
    /// as the session is certain to live after the request was sent: half
    /// the negotiated session timeout. A server expires a session no
    /// earlier than one session timeout after it last heard from the
    /// client; in an ensemble the leader, which expires sessions, hears of
    /// a follower's clients only at its pings (every half `tickTime`, and
    /// the server keeps the session timeout at 2 × `tickTime` or more), and
    /// the client speaks at least every 9/40 of the timeout (zookeeper-client
    /// pings after 3 of its ticks idle, a tick being 1/20 of the session
    /// timeout or 1/8 of a connection timeout of at most 3/5 of it): the half is
    /// what is left when both delays are at their longest
    /// (`docs/zookeeper.md`).
    pub(crate) fn grantable(&self, c: &zk::Client, ttl: Duration) -> Duration {
        match self.curator() {
            true => ttl.min(c.session_timeout() / 2),
            false => ttl,
        }
    }

    fn refuse_shared(&self) -> Result<()> {
        match self.curator() {
            true => Err(Error::unsupported(
                crate::error::NAME,
                "read-write locks in the Curator layout",
            )),
            false => Ok(()),
        }
    }

    /// The leader's clock now, in milliseconds: the `mtime` of a write to
    /// the store's clock node. Reads carry no server time, and a lease's
    /// expiry must be judged on the clock that wrote it (I4).
    pub(crate) async fn now(&self, c: &zk::Client) -> Result<i64> {
        let path = format!("{}/clock", self.conn.options.base());
        let stat = self
            .conn
            .call("reading the clock", c.set_data(&path, b"", None))
            .await?;
        Ok(stat.mtime)
    }

    /// The names of the lease nodes (writers' and readers') under `dir`,
    /// oldest first (none when the key's container does not exist).
    async fn children(&self, c: &zk::Client, dir: &str) -> Result<Vec<String>> {
        Ok(self.listing(c, dir).await?.0)
    }

    /// [`ZkBackend::children`], and whether a writer intent node exists.
    pub(crate) async fn listing(&self, c: &zk::Client, dir: &str) -> Result<(Vec<String>, bool)> {
        let mut names = self
            .conn
            .maybe("listing a key's leases", c.list_children(dir))
            .await?
            .unwrap_or_default();
        if self.curator() {
            names.retain(|n| crate::curator::sequence(n).is_some());
            names.sort_by(|a, b| seq(a).cmp(seq(b)));
            return Ok((names, false));
        }
        let intent = names.iter().any(|n| n == shared::INTENT);
        names.retain(|n| n.starts_with(NODE) || n.starts_with(READER));
        // Ten-digit sequence numbers: byte order is creation order.
        names.sort_by(|a, b| seq(a).cmp(seq(b)));
        Ok((names, intent))
    }

    async fn read(&self, c: &zk::Client, path: String) -> Result<Option<Node>> {
        // In the Curator layout the side node is asked for right behind the
        // node, in the same round trip: one session's requests are answered
        // in order, so it is read at a state no older than the node's (a
        // record written since the node was read is newer, never older).
        let node_read = c.get_data(&path);
        let side_path = self.side_path(&path);
        let side_read = self.curator().then(|| c.get_data(&side_path));
        let Some((bytes, stat)) = self.conn.maybe("reading a lease", node_read).await? else {
            return Ok(None);
        };
        let side = match side_read {
            Some(read) => self.conn.maybe("reading a lease", read).await?,
            None => None,
        };
        let parse = |bytes: &[u8], path: &str| {
            serde_json::from_slice::<Record>(bytes)
                .map_err(|e| bad_value(format!("{path} holds no lease record: {e}")))
        };
        if let Some(Contender { fencelock }) = self
            .curator()
            .then(|| serde_json::from_slice::<Contender>(&bytes).ok())
            .flatten()
        {
            let node = Node::created(path, fencelock, stat);
            return Ok(Some(match side {
                Some((bytes, lease)) => Node {
                    record: parse(&bytes, &side_path)?,
                    lease: Some(lease),
                    ..node
                },
                None => node,
            }));
        }
        let record = match parse(&bytes, &path) {
            Ok(record) => record,
            // A foreign node is ephemeral: it has no lease child.
            Err(_) if self.curator() => self.foreign(&path, &stat),
            Err(e) => return Err(e),
        };
        let node = Node::created(path, record, stat);
        // A persistent contender of an older fencelock (Curator layout):
        // only a lease written since its creation has a child.
        if stat.num_children == 0 || node.record.foreign || !self.curator() {
            return Ok(Some(node));
        }
        let lease_path = self.lease_path(&node);
        // The node's own data never changes, so the pair is the lease as
        // of this read; the child goes only with the node, so a child gone
        // since is a node gone.
        let Some((bytes, lease)) = self
            .conn
            .maybe("reading a lease", c.get_data(&lease_path))
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(Node {
            record: parse(&bytes, &lease_path)?,
            lease: Some(lease),
            ..node
        }))
    }

    /// The record standing for a Curator or kazoo contender's node: its
    /// owner is its session (`zk-session:0x…`), or its name when it
    /// belongs to none, its kind the client that named it.
    fn foreign(&self, path: &str, stat: &zk::Stat) -> Record {
        let name = path.rsplit('/').next().unwrap_or_default();
        let owner = match stat.ephemeral_owner {
            0 => format!("zk-node:{name}"),
            session => format!("zk-session:{session:#x}"),
        };
        Record {
            owner,
            kind: Some(crate::curator::client_of(name).to_owned()),
            data: None,
            ttl_ms: ttl_ms(self.conn.options.session_timeout),
            queued: false,
            foreign: true,
        }
    }

    /// The lease nodes of `dir` named by `names`, read concurrently (one
    /// session carries them all, so they are pipelined), oldest first.
    async fn read_all(&self, c: &zk::Client, dir: &str, names: Vec<String>) -> Result<Vec<Node>> {
        let nodes = futures_util::future::try_join_all(
            names
                .into_iter()
                .map(|name| self.read(c, format!("{dir}/{name}"))),
        )
        .await?;
        Ok(nodes.into_iter().flatten().collect())
    }

    /// Every lease node of `key`, oldest first.
    pub(crate) async fn nodes(&self, c: &zk::Client, key: &str) -> Result<Vec<Node>> {
        let dir = self.key_dir(key);
        let names = self.children(c, &dir).await?;
        self.read_all(c, &dir, names).await
    }

    /// The node of `lease` held in `mode`, whether or not it has expired:
    /// the cached one, or else the one found on the server.
    async fn find(&self, c: &zk::Client, lease: &LeaseId, mode: LockMode) -> Result<Option<Node>> {
        if let Some(node) = self.cached(lease, mode) {
            return Ok(Some(node));
        }
        Ok(self
            .nodes(c, lease.key.as_str())
            .await?
            .into_iter()
            .find(|node| {
                node.mode() == mode
                    && !node.record.foreign
                    && node.token() == lease.token
                    && node.record.owner == lease.owner.as_str()
            }))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Node>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached node of `lease` if it is a `mode` lease: a token names
    /// one node, so one cache serves both modes, but a reader's lease id
    /// must never reach a writer's node through it, nor the reverse (I3).
    fn cached(&self, lease: &LeaseId, mode: LockMode) -> Option<Node> {
        self.cache()
            .get(lease)
            .filter(|node| node.mode() == mode)
            .cloned()
    }

    /// `node`, just written for `request`, as its grant, remembered so that
    /// renew and release are one conditional write.
    pub(crate) fn granted(&self, request: &AcquireRequest, node: Node) -> Acquire {
        let token = node.token();
        // What was written, which in the Curator layout may be less than
        // asked for (`grantable`).
        let ttl = match self.curator() {
            true => request.ttl.min(Duration::from_millis(node.record.ttl_ms)),
            false => request.ttl,
        };
        let grant = Grant::new(token, ttl, ms_to_time(node.expires_ms()));
        self.remember(&request.lease(token), node);
        Acquire::Granted(grant)
    }

    pub(crate) fn remember(&self, lease: &LeaseId, node: Node) {
        let mut cache = self.cache();
        if cache.len() >= CACHE_SWEEP {
            // Ended an hour ago by the local clock: certainly lost.
            let long_ago = Utc::now().timestamp_millis() - 3_600_000;
            cache.retain(|_, n| n.expires_ms() > long_ago);
        }
        cache.insert(lease.clone(), node);
    }

    fn forget(&self, lease: &LeaseId) {
        self.cache().remove(lease);
    }

    /// Deletes `node` if it is unchanged since read: `true` when it is gone
    /// (by this call or another), `false` when it changed (was renewed).
    pub(crate) async fn delete(&self, c: &zk::Client, node: &Node) -> Result<bool> {
        match self.remove(c, node, true).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(true),
            Err(zk::Error::BadVersion) => Ok(false),
            Err(e) => Err(map("deleting a lease", e)),
        }
    }

    /// Deletes `node`, conditional on the version of its lease as last
    /// written when `conditional` (`BadVersion` when it was written since).
    /// In the Curator layout the node and its [`LEASE`] child go together
    /// in one multi op, and the node's own version (never written) is
    /// checked too.
    pub(crate) async fn remove(
        &self,
        c: &zk::Client,
        node: &Node,
        conditional: bool,
    ) -> std::result::Result<(), zk::Error> {
        if !self.curator() {
            let version = conditional.then_some(node.stat.version);
            return self.conn.raw(c.delete(&node.path, version)).await;
        }
        if node.ephemeral() {
            return self.remove_ephemeral(c, node, conditional).await;
        }
        let lease_path = self.lease_path(node);
        let mut child = node.lease.is_some();
        // The child goes only with the node, so `NoNode` means both are
        // gone; `NotEmpty` means a lease was written since `node` was read.
        for _ in 0..2 {
            let mut multi = c.new_multi_writer();
            if child {
                multi.add_delete(&lease_path, conditional.then_some(node.written().version))?;
            }
            multi.add_delete(&node.path, conditional.then_some(node.stat.version))?;
            let commit = multi.commit();
            match self
                .conn
                .raw(async { commit.await.map_err(zk::Error::from) })
                .await
            {
                Ok(_) => return Ok(()),
                Err(zk::Error::NotEmpty) if conditional => return Err(zk::Error::BadVersion),
                // Unconditional: whatever it holds now goes too.
                Err(zk::Error::NotEmpty) if !child => child = true,
                Err(e) => return Err(e),
            }
        }
        Err(zk::Error::NotEmpty)
    }

    /// [`ZkBackend::remove`] of an ephemeral contender and its side node.
    /// Conditional: one multi op that deletes the side node at the version
    /// read, or, when none was read, creates and deletes it (which fails
    /// with `NodeExists` if a lease was written since: `BadVersion`), and
    /// the node. The side node goes only with its node (here, or as an
    /// orphan once its node is gone), so `NoNode` means the node is gone.
    /// Unconditional: the node, then its side node; one left behind is an
    /// orphan, never read as a lease, which `cleanup` deletes.
    async fn remove_ephemeral(
        &self,
        c: &zk::Client,
        node: &Node,
        conditional: bool,
    ) -> std::result::Result<(), zk::Error> {
        let side = self.side_path(&node.path);
        if !conditional {
            let gone = self.conn.raw(c.delete(&node.path, None)).await;
            match self.conn.raw(c.delete(&side, None)).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => {
                    tracing::debug!(%side, error = %e, "an orphaned lease record left for cleanup")
                }
            }
            return gone;
        }
        let plain = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let mut multi = c.new_multi_writer();
        match &node.lease {
            Some(lease) => multi.add_delete(&side, Some(lease.version))?,
            None => {
                multi.add_create(&side, b"", &plain)?;
                multi.add_delete(&side, None)?;
            }
        }
        multi.add_delete(&node.path, Some(node.stat.version))?;
        let commit = multi.commit();
        match self
            .conn
            .raw(async { commit.await.map_err(zk::Error::from) })
            .await
        {
            Ok(_) => Ok(()),
            Err(zk::Error::NodeExists) => Err(zk::Error::BadVersion),
            Err(e) => Err(e),
        }
    }

    /// Writes `record` as `node`'s lease, conditional on the version last
    /// written (`BadVersion` when written since, `NoNode` when deleted),
    /// and answers the node as now stored. In the Curator layout the
    /// record goes to the [`LEASE`] child, created by the first write.
    pub(crate) async fn write(
        &self,
        c: &zk::Client,
        node: &Node,
        record: Record,
    ) -> Result<std::result::Result<Node, zk::Error>> {
        let bytes = record.to_bytes()?;
        let answer = match (self.curator(), &node.lease) {
            (false, _) => {
                let answer = c.set_data(&node.path, &bytes, Some(node.stat.version));
                self.conn.raw(answer).await.map(|stat| Node {
                    stat,
                    record,
                    ..node.clone()
                })
            }
            (true, _) if node.ephemeral() => self.write_side(c, node, record, &bytes).await,
            (true, lease) => {
                let path = self.lease_path(node);
                let answer = match lease {
                    Some(lease) => {
                        let answer = c.set_data(&path, &bytes, Some(lease.version));
                        self.conn.raw(answer).await
                    }
                    None => {
                        let plain = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        match self.conn.raw(c.create(&path, &bytes, &plain)).await {
                            Ok((stat, _)) => Ok(stat),
                            // Written since, by another backend.
                            Err(zk::Error::NodeExists) => Err(zk::Error::BadVersion),
                            Err(e) => Err(e),
                        }
                    }
                };
                answer.map(|stat| Node {
                    record,
                    lease: Some(stat),
                    ..node.clone()
                })
            }
        };
        Ok(answer)
    }

    /// Deletes the side nodes whose contender is gone (its session expired,
    /// or an unconditional remove stopped halfway). They are no lease: a
    /// read finds the contender gone first. A contender never comes back
    /// (its name is unique) and no record is written for a missing one,
    /// so a side node found orphaned stays so. Not counted as leases.
    async fn remove_orphans(&self, c: &zk::Client) -> Result<()> {
        let dir = self.conn.leases_dir();
        let Some(names) = self
            .conn
            .maybe("listing lease records", c.list_children(&dir))
            .await?
        else {
            return Ok(());
        };
        let owners = names.iter().map(|name| {
            let contender = name.strip_suffix(SIDE).and_then(decode);
            async move {
                match contender {
                    // One session carries them all: pipelined.
                    Some(path) => self
                        .conn
                        .raw(c.check_stat(&path))
                        .await
                        .map(|s| s.is_none()),
                    // Not a record of this crate's: left alone.
                    None => Ok(false),
                }
            }
        });
        let orphaned = futures_util::future::join_all(owners).await;
        for (name, orphaned) in names.iter().zip(orphaned) {
            if orphaned.map_err(|e| map("reading a lease's node", e))? {
                match self
                    .conn
                    .raw(c.delete(&format!("{dir}/{name}"), None))
                    .await
                {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(map("deleting an orphaned lease record", e)),
                }
            }
        }
        Ok(())
    }

    /// Whether a write of `node`'s lease through `c` may extend how long it
    /// is trusted (a renewal, a queue entry's grant): only through the
    /// session that owns an ephemeral node, because the write then also
    /// proves that session alive when it was sent, which is what a grant's
    /// trusted time counts from ([`ZkBackend::grantable`]). Through another
    /// session (another backend, a `resume` in another process) the node
    /// may go with its own session at any moment.
    fn owns(c: &zk::Client, node: &Node) -> bool {
        !node.ephemeral() || node.stat.ephemeral_owner == c.session_id().0
    }

    /// [`ZkBackend::write`] of an ephemeral contender's lease to its side
    /// node, in one multi op with a check that the node still exists (its
    /// version never changes): a lease whose node went with its session is
    /// gone, and writing its record would not bring it back.
    async fn write_side(
        &self,
        c: &zk::Client,
        node: &Node,
        record: Record,
        bytes: &[u8],
    ) -> std::result::Result<Node, zk::Error> {
        let side = self.side_path(&node.path);
        let plain = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let mut multi = c.new_multi_writer();
        multi.add_check_version(&node.path, node.stat.version)?;
        match &node.lease {
            Some(lease) => multi.add_set_data(&side, bytes, Some(lease.version))?,
            None => {
                // A create in a multi op answers no stat on the servers
                // tested (3.8: version -1, `mtime` 0), and the expiry
                // counts from the `mtime`: the write that follows it in
                // the same transaction answers the stat.
                multi.add_create(&side, bytes, &plain)?;
                multi.add_set_data(&side, bytes, Some(0))?;
            }
        }
        let commit = multi.commit();
        let results = self
            .conn
            .raw(async { commit.await.map_err(zk::Error::from) })
            .await
            .map_err(|e| match e {
                // Written since, by another backend.
                zk::Error::NodeExists => zk::Error::BadVersion,
                e => e,
            })?;
        let stat = match results.into_iter().last() {
            Some(zk::MultiWriteResult::SetData { stat }) => stat,
            other => {
                return Err(zk::Error::UnexpectedError(format!(
                    "a lease's multi op answered {other:?} for its write"
                )))
            }
        };
        Ok(Node {
            record,
            lease: Some(stat),
            ..node.clone()
        })
    }

    /// [`ZkBackend::write`] of a queue entry that becomes the lease, in
    /// the Curator layout (fencelock's own grants it without a write,
    /// `queue.rs`). A grant is trusted from before its request: see
    /// `owns`. (An entry is this backend's, created through its session,
    /// which is replaced only once expired, taking the entry with it.)
    pub(crate) async fn write_grant(
        &self,
        c: &zk::Client,
        node: &Node,
        record: Record,
    ) -> Result<std::result::Result<Node, zk::Error>> {
        if !Self::owns(c, node) {
            return Ok(Err(zk::Error::BadVersion));
        }
        self.write(c, node, record).await
    }

    /// Creates the key's container `dir` unless it exists (in the Curator
    /// layout with its missing parents, containers too, as Curator's
    /// `creatingParentContainersIfNeeded` does).
    async fn ensure_dir(&self, c: &zk::Client, dir: &str) -> Result<()> {
        let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        if self.curator() {
            return self
                .conn
                .call("creating a key", c.mkdir(dir, &container))
                .await;
        }
        match self.conn.raw(c.create(dir, b"", &container)).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(map("creating a key", e)),
        }
    }

    /// Creates a `mode` lease node of `key`, creating the key's
    /// container first when it is missing (or was just reaped by the
    /// server for being empty).
    pub(crate) async fn create(
        &self,
        c: &zk::Client,
        key: &str,
        mode: LockMode,
        bytes: &[u8],
    ) -> Result<(String, zk::Stat)> {
        // In the Curator layout the node is the session's, as Curator's and
        // kazoo's are: when a holder dies, the server deletes its node once
        // its session expires, which wakes the recipes queued behind it
        // (they watch that node and cannot judge a lease).
        let (node, name, wrapped);
        let bytes = match self.curator() {
            true => {
                node = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
                name = crate::curator::node_name(key);
                wrapped = [br#"{"fencelock":"#.as_slice(), bytes, b"}"].concat();
                wrapped.as_slice()
            }
            false => {
                node = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
                name = prefix(mode).to_owned();
                bytes
            }
        };
        let dir = self.key_dir(key);
        let path = format!("{dir}/{name}");
        for _ in 0..3 {
            match self
                .conn
                .maybe("creating a lease", c.create(&path, bytes, &node))
                .await?
            {
                Some((stat, seq)) => return Ok((format!("{path}{seq}"), stat)),
                None => self.ensure_dir(c, &dir).await?,
            }
        }
        Err(bad_value(format!(
            "{dir} disappeared three times while a lease was created in it"
        )))
    }

    /// After writing `mine` at `now`: [`Settled::First`] if every older
    /// node (a writer's or a reader's) has expired (those are deleted),
    /// else the holder. A grant withdraws `owner`'s writer intent.
    pub(crate) async fn settle(
        &self,
        c: &zk::Client,
        key: &LockKey,
        owner: &Owner,
        mine: &str,
        now: i64,
    ) -> Result<Settled> {
        let dir = self.key_dir(key.as_str());
        let own = mine.rsplit('/').next().unwrap_or_default();
        let (mut older, intent) = self.listing(c, &dir).await?;
        if !older.iter().any(|name| name == own) {
            return Ok(Settled::Gone);
        }
        older.retain(|name| seq(name) < seq(own));
        if let Some(holder) = self.first_live(c, key, older, now).await? {
            return Ok(Settled::Behind(holder));
        }
        if intent {
            self.withdraw_intent(c, &dir, owner).await?;
        }
        Ok(Settled::First)
    }

    /// The first unexpired lease among `names` (nodes of `key`, oldest
    /// first) at `now`; expired ones before it are deleted.
    async fn first_live(
        &self,
        c: &zk::Client,
        key: &LockKey,
        names: Vec<String>,
        now: i64,
    ) -> Result<Option<LockInfo>> {
        let dir = self.key_dir(key.as_str());
        for node in self.read_all(c, &dir, names).await? {
            // An expired lease that was renewed since it was read is live
            // again as far as anyone can tell: refuse rather than judge.
            if node.live_at(now) || !self.delete(c, &node).await? {
                return Ok(Some(node.info(key, now)?));
            }
        }
        Ok(None)
    }

    /// The record a renewal of `node` to `ttl` writes (conditional on the
    /// version read; the write's `mtime` becomes now on the leader). A
    /// queue entry granted without a write (`queue.rs`) loses its mark.
    fn renewed(node: &Node, ttl: Duration) -> Record {
        Record {
            ttl_ms: ttl_ms(ttl),
            queued: false,
            ..node.record.clone()
        }
    }

    /// Judges the answer to a renewal write of `node`: the node as now
    /// stored, or [`Error::NotHeld`] when it was gone, changed, or had
    /// expired before the write (I3).
    fn judge(
        node: &Node,
        lease: &LeaseId,
        answer: std::result::Result<Node, zk::Error>,
    ) -> Result<Node> {
        let now = match answer {
            Ok(now) => now,
            Err(zk::Error::NoNode | zk::Error::BadVersion) => return Err(Error::not_held(lease)),
            Err(e) => return Err(map("renewing a lease", e)),
        };
        if node.live_at(now.written().mtime) {
            Ok(now)
        } else {
            Err(Error::not_held(lease))
        }
    }

    /// Renews the lease of `node` to `ttl`; an expired one is removed
    /// rather than revived (a rival may already have judged it free).
    async fn touch(
        &self,
        c: &zk::Client,
        node: &Node,
        lease: &LeaseId,
        ttl: Duration,
    ) -> Result<Grant> {
        if !Self::owns(c, node) {
            return Err(Error::not_held(lease));
        }
        let answer = self.write(c, node, Self::renewed(node, ttl)).await?;
        let expired = matches!(&answer, Ok(now) if !node.live_at(now.written().mtime));
        match Self::judge(node, lease, answer) {
            Ok(now) => {
                let grant = Grant::new(lease.token, ttl, ms_to_time(now.expires_ms()));
                self.remember(lease, now);
                Ok(grant)
            }
            Err(e) => {
                if expired {
                    let _ = self.remove(c, node, false).await;
                }
                if matches!(e, Error::NotHeld { .. }) {
                    self.forget(lease);
                }
                Err(e)
            }
        }
    }

    /// Every unexpired lease (with its key) at `now`, sorted by key, and how
    /// many expired ones are stored.
    async fn scan(
        &self,
        c: &zk::Client,
        prefix: Option<&str>,
        now: i64,
    ) -> Result<(Vec<(LockKey, Node)>, Vec<Node>)> {
        // In the Curator layout a key's leading `/` is optional: `/a` and
        // `a` are one lock, listed without it.
        let curator = self.curator();
        let bare = |k: &str| match curator {
            true => k.trim_start_matches('/').to_owned(),
            false => k.to_owned(),
        };
        let prefix = prefix.map(bare);
        let prefix = prefix.as_deref();
        let names = match curator {
            true => self.curator_keys(c, prefix).await?,
            false => self
                .conn
                .call("listing keys", c.list_children(&self.conn.locks_dir()))
                .await?
                .iter()
                .filter_map(|n| decode(n))
                .collect(),
        };
        let mut keys: Vec<LockKey> = names
            .into_iter()
            .filter(|k| prefix.is_none_or(|p| bare(k).starts_with(p)))
            .filter_map(|k| LockKey::new(k).ok())
            .collect();
        keys.sort();
        let (mut live, mut expired) = (Vec::new(), Vec::new());
        for key in keys {
            let dir = self.key_dir(key.as_str());
            let mut nodes = Vec::new();
            for name in self.children(c, &dir).await? {
                let Some(node) = self.read(c, format!("{dir}/{name}")).await? else {
                    continue;
                };
                if node.live_at(now) {
                    nodes.push(node);
                } else {
                    expired.push(node);
                }
            }
            live.extend(shared::holders(nodes).into_iter().map(|n| (key.clone(), n)));
        }
        Ok((live, expired))
    }

    /// The keys of the Curator layout that may start with `prefix`: every
    /// node under the chroot with contender children, found by walking the
    /// tree (skipping fencelock's own nodes and `/zookeeper`), one listing
    /// per node, so a chroot of its own keeps this cheap.
    async fn curator_keys(&self, c: &zk::Client, prefix: Option<&str>) -> Result<Vec<String>> {
        let options = &self.conn.options;
        // Only paths on the way to the prefix are walked (an election's
        // prefix names the path after `ELECTION_PREFIX`).
        let along = prefix.and_then(|p| match p.strip_prefix(fencelock_core::ELECTION_PREFIX) {
            Some(path) => Some(path.trim_start_matches('/')),
            None if fencelock_core::ELECTION_PREFIX.starts_with(p) => None,
            None => Some(p),
        });
        let base = options.base();
        let skip = [
            format!("{base}/clock"),
            format!("{base}/fences"),
            format!("{base}/leases"),
            format!("{}/zookeeper", options.chroot),
        ];
        let escaped = self.conn.locks_dir();
        let mut keys = Vec::new();
        let mut todo = vec![String::new()];
        while let Some(relative) = todo.pop() {
            let path = match relative.is_empty() {
                true if options.chroot.is_empty() => "/".to_owned(),
                true => options.chroot.clone(),
                false => format!("{}/{relative}", options.chroot),
            };
            let Some(children) = self
                .conn
                .maybe("listing keys", c.list_children(&path))
                .await?
            else {
                continue;
            };
            if path == escaped {
                // Keys no path can name (`curator::key_dir`).
                keys.extend(children.iter().filter_map(|n| decode(n)));
                continue;
            }
            let contenders: Vec<&String> = children
                .iter()
                .filter(|n| crate::curator::sequence(n).is_some())
                .collect();
            if !contenders.is_empty() {
                let latch = contenders.iter().any(|n| crate::curator::is_latch(n));
                keys.push(crate::curator::key_of(&relative, latch));
            }
            for child in children {
                if crate::curator::sequence(&child).is_some() {
                    continue;
                }
                let below = match relative.is_empty() {
                    true => child,
                    false => format!("{relative}/{child}"),
                };
                let absolute = format!("{}/{below}", options.chroot);
                let on_the_way = along
                    .is_none_or(|p| below.starts_with(p) || p.starts_with(&below))
                    || escaped.starts_with(&absolute);
                if on_the_way && !skip.contains(&absolute) {
                    todo.push(below);
                }
            }
        }
        Ok(keys)
    }

    /// Renews `lease`, a reader's or a writer's (its mode says which).
    async fn renew_as(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let mode = lease.mode;
        if mode == LockMode::Shared {
            self.refuse_shared()?;
        }
        let c = self.conn.client().await?;
        let ttl = self.grantable(&c, ttl);
        let Some(node) = self.find(&c, lease, mode).await? else {
            return Err(Error::not_held(lease));
        };
        match self.touch(&c, &node, lease, ttl).await {
            // The cached node was stale (renewed through another backend):
            // look it up and try once more.
            Err(Error::NotHeld { .. }) if self.cached(lease, mode).is_none() => {
                match self.find(&c, lease, mode).await? {
                    Some(fresh) if fresh.written().mzxid != node.written().mzxid => {
                        self.touch(&c, &fresh, lease, ttl).await
                    }
                    _ => Err(Error::not_held(lease)),
                }
            }
            other => other,
        }
    }

    /// Renews a batch of leases, readers' and writers' alike.
    async fn renew_all(&self, renewals: &[Renewal]) -> Vec<Result<Grant>> {
        // One session carries every request, so these run pipelined.
        futures_util::future::join_all(renewals.iter().map(|r| self.renew_as(&r.lease, r.ttl)))
            .await
    }

    /// Releases `lease`, a reader's or a writer's.
    async fn release_as(&self, lease: &LeaseId) -> Result<()> {
        let mode = lease.mode;
        if mode == LockMode::Shared {
            self.refuse_shared()?;
        }
        let c = self.conn.client().await?;
        let node = match self.cached(lease, mode) {
            Some(node) => node,
            None => self
                .find(&c, lease, mode)
                .await?
                .ok_or_else(|| Error::not_held(lease))?,
        };
        self.forget(lease);
        if self.curator() {
            return self.release_unwritten(&c, node, lease, mode).await;
        }
        // One transaction of two writes: a touch conditional on the
        // version read, whose `mtime` proves on the leader's clock whether
        // the lease was still unexpired, then a delete conditional on the
        // touch's version. Deleting a lease that had just expired is
        // harmless: nobody took it over, or the touch would have found it
        // gone. One request, not two sent together: the client library
        // leaves Nagle's algorithm on, so a second small request waited
        // for the first one's acknowledgement, up to the 40 ms of a
        // delayed ACK on every release (docs/multi-dc.md).
        let record = Self::renewed(&node, RELEASING);
        let bytes = record.to_bytes()?;
        let mut multi = c.new_multi_writer();
        multi
            .add_set_data(&node.path, &bytes, Some(node.stat.version))
            .and_then(|()| multi.add_delete(&node.path, Some(node.stat.version.wrapping_add(1))))
            .map_err(|e| map("releasing a lease", e))?;
        let commit = multi.commit();
        let answer = match self
            .conn
            .raw(async { commit.await.map_err(zk::Error::from) })
            .await
        {
            // The touch's condition failed: judged below.
            Err(e @ (zk::Error::NoNode | zk::Error::BadVersion)) => Err(e),
            Err(e) => return Err(map("releasing a lease", e)),
            Ok(results) => Ok(results),
        };
        let applied = answer.is_ok();
        let touched = answer.and_then(|results| match results.into_iter().next() {
            Some(zk::MultiWriteResult::SetData { stat }) => Ok(Node {
                stat,
                record,
                ..node.clone()
            }),
            other => Err(zk::Error::UnexpectedError(format!(
                "a release's multi op answered {other:?} for its touch"
            ))),
        });
        match Self::judge(&node, lease, touched) {
            // A stale cache entry: the lease may still be there.
            Err(Error::NotHeld { .. }) if !applied => match self.find(&c, lease, mode).await? {
                Some(fresh) if fresh.written().mzxid != node.written().mzxid => {
                    self.cache().insert(lease.clone(), fresh);
                    Box::pin(self.release_as(lease)).await
                }
                _ => Err(Error::not_held(lease)),
            },
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }
}

impl ZkBackend {
    /// [`ZkBackend::release_as`] in the Curator layout: the node and its
    /// [`LEASE`] child deleted in one multi op, conditional on the lease's
    /// version, without a touch first (the node is never written, and a
    /// touch of the child would cost a round trip). The leader's clock is
    /// read first: a lease that had ended by then is not released (it is
    /// deleted, as any contender would); one that ends between that read
    /// and the delete was taken over by nobody, or the delete would have
    /// found it gone.
    async fn release_unwritten(
        &self,
        c: &zk::Client,
        node: Node,
        lease: &LeaseId,
        mode: LockMode,
    ) -> Result<()> {
        let now = self.now(c).await?;
        match self.remove(c, &node, true).await {
            Ok(()) if node.live_at(now) => Ok(()),
            Ok(()) | Err(zk::Error::NoNode) => Err(Error::not_held(lease)),
            // A stale cache entry: the lease may have been renewed since.
            Err(zk::Error::BadVersion) => match self.find(c, lease, mode).await? {
                Some(fresh) if fresh.written().mzxid != node.written().mzxid => {
                    Box::pin(self.release_unwritten(c, fresh, lease, mode)).await
                }
                _ => Err(Error::not_held(lease)),
            },
            Err(e) => Err(map("releasing a lease", e)),
        }
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        crate::error::NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_wakeups(true)
            .with_persistent(true)
            .with_keeps_expired(true)
            .with_set_data(true)
            .with_fair(true)
            // Contender nodes are ephemeral in the Curator layout.
            .with_session_bound(self.curator())
            // Curator's read-write lock names its nodes otherwise.
            .with_shared(!self.curator())
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if request.mode == LockMode::Shared {
            self.refuse_shared()?;
            return self.acquire_reader(request).await;
        }
        if request.min_token.is_some() {
            return Err(Error::unsupported(crate::error::NAME, "token floors"));
        }
        if request.queue {
            return self.try_acquire_queued(request).await;
        }
        let c = self.conn.client().await?;
        let record = Record {
            owner: request.owner.to_string(),
            kind: request.kind.clone(),
            data: request.data.clone(),
            ttl_ms: ttl_ms(self.grantable(&c, request.ttl)),
            queued: false,
            foreign: false,
        };
        let bytes = record.to_bytes()?;
        let key = request.key.as_str();
        let (mine, stat) = self.create(&c, key, LockMode::Exclusive, &bytes).await?;
        // The node's creation time is "now" on the leader: any older lease
        // that ends by then has expired.
        let outcome = self
            .settle(&c, &request.key, &request.owner, &mine, stat.ctime)
            .await;
        if let Ok(Settled::First) = outcome {
            return Ok(self.granted(request, Node::created(mine, record, stat)));
        }
        // Not granted (or unknown): withdraw the node, so that it never
        // stands in the way of the next contender. If even that fails, it
        // expires after its TTL like any lease.
        let _ = c.delete(&mine, None).await;
        match outcome? {
            Settled::Behind(holder) => Ok(Acquire::Held(Some(holder))),
            Settled::First | Settled::Gone => Ok(Acquire::Held(None)),
        }
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        self.renew_as(lease, ttl).await
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.release_as(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let c = self.conn.client().await?;
        let now = self.now(&c).await?;
        let live = self.nodes(&c, key.as_str()).await?;
        let live = live.into_iter().filter(|node| node.live_at(now));
        // The writer, else the reader whose lease ends last.
        shared::holders(live.collect())
            .into_iter()
            .max_by_key(|node| (node.mode() == LockMode::Exclusive, node.expires_ms()))
            .map(|node| node.info(key, now))
            .transpose()
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let c = self.conn.client().await?;
        let mut found = self.find(&c, lease, LockMode::Exclusive).await?;
        let mut retried = false;
        loop {
            let Some(node) = found else {
                return Err(Error::not_held(lease));
            };
            // A write moves the `mtime` the expiry counts from, so the TTL
            // written is what is left of the lease: it then ends no
            // earlier than before, and later only by this write's delay.
            let now = self.now(&c).await?;
            let left = u64::try_from(node.expires_ms() - now).unwrap_or(0);
            if left == 0 {
                return Err(Error::not_held(lease));
            }
            let record = Record {
                data: data.clone(),
                ttl_ms: left,
                queued: false,
                ..node.record.clone()
            };
            match self.write(&c, &node, record).await? {
                Ok(now) => {
                    self.remember(lease, now);
                    return Ok(());
                }
                // Renewed since it was cached or read: once more, fresh.
                Err(zk::Error::BadVersion) if !retried => {
                    retried = true;
                    self.forget(lease);
                    found = self.find(&c, lease, LockMode::Exclusive).await?;
                }
                Err(zk::Error::NoNode | zk::Error::BadVersion) => {
                    self.forget(lease);
                    return Err(Error::not_held(lease));
                }
                Err(e) => return Err(map("replacing a lease's data", e)),
            }
        }
    }

    async fn changes(&self) -> Result<Option<ChangeFeed>> {
        // Curator's keys are paths of any depth, not one node per key.
        if self.curator() {
            return Ok(None);
        }
        Ok(Some(crate::changes::feed(self).await?))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        let c = self.conn.client().await?;
        let dir = self.key_dir(key.as_str());
        let first = self.arm(&c, &dir, None).await?;
        let backend = self.clone();
        let wakeups = futures_util::stream::unfold(
            (backend, dir, Some(first)),
            |(backend, dir, mut armed)| async move {
                let mut renewed = None;
                loop {
                    let watcher = match armed.take() {
                        Some(w) => w,
                        // On the session in use now: with `balance=first`
                        // it may have moved to another server.
                        None => {
                            let c = backend.conn.client().await.ok()?;
                            backend.arm(&c, &dir, renewed.as_deref()).await.ok()?
                        }
                    };
                    let Some(watcher) = watcher else {
                        // The key is free, or what was watched has moved:
                        // try now.
                        break;
                    };
                    let event = watcher.await;
                    match event.event_type {
                        // A renewal: the holder is still there, unless it
                        // is gone by the time the watch is set again.
                        zk::EventType::NodeDataChanged => renewed = Some(event.path),
                        zk::EventType::Session if event.session_state.is_terminated() => {
                            return None
                        }
                        _ => break,
                    }
                }
                Some(((), (backend, dir, None)))
            },
        );
        let wakeups = WakeSubscription::from_stream(wakeups);
        // Every deletion of the node a waiter waits behind wakes it (an
        // expiry is no event, but the holder's `Held` answer bounds that
        // wait). In fencelock's layout a woken waiter takes its turn on a
        // read (`queue.rs`), so a try of its own between wake-ups would
        // only stand in the way: a clock write through the leader, which
        // the answer to the wake-up waits behind. In Curator's the grant is
        // a write, which a try already on its way can save.
        Ok(Some(match self.curator() {
            true => wakeups,
            false => wakeups.complete(),
        }))
    }

    fencelock_core::offers!(admin, fair_queue);

    fn write_intents(&self) -> Option<&dyn WriteIntents> {
        // Curator's layout has no readers (`refuse_shared`).
        (!self.curator()).then_some(self as &dyn WriteIntents)
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        Ok(self.renew_all(renewals).await)
    }
}

/// What a waiter awaits: the first event of its watches.
type Armed = std::pin::Pin<Box<dyn std::future::Future<Output = zk::WatchedEvent> + Send>>;

impl ZkBackend {
    /// A watch on the oldest lease node of `dir` (the holder, or a
    /// contender about to withdraw) and on the writer intent, if there is
    /// one, firing on the first event of either; `None` when the waiter
    /// should try at once: there is no node, one of the two is gone
    /// between the listing and its watch, or `renewed` (a node whose data
    /// change, a renewal, fired the last watch) is neither of them any
    /// more. Only the oldest node is watched, so contenders' nodes coming
    /// and going do not wake every waiter (the herd effect of watching the
    /// children). Readers wait for the oldest lease or, once an intent
    /// stops them, for the intent.
    ///
    /// A node gone since the waiter last looked is always a wake-up: else
    /// the oldest node left could be the waiter's own queue entry, whose
    /// watch never fires for it. A release is a touch and then a delete,
    /// and a waiter that set its watch again after the touch, once the
    /// delete had landed, watched its own entry and took its turn only on
    /// a try of its own, up to a second later.
    async fn arm(&self, c: &zk::Client, dir: &str, renewed: Option<&str>) -> Result<Option<Armed>> {
        let (names, intent) = self.listing(c, dir).await?;
        let intent = intent.then(|| format!("{dir}/{}", shared::INTENT));
        let oldest = names.first().map(|name| format!("{dir}/{name}"));
        if renewed.is_some_and(|r| Some(r) != oldest.as_deref() && Some(r) != intent.as_deref()) {
            return Ok(None);
        }
        let mut watchers = Vec::new();
        for path in intent.into_iter().chain(oldest) {
            let (stat, watcher) = self
                .conn
                .call("watching a lease", c.check_and_watch_stat(&path))
                .await?;
            if stat.is_none() {
                return Ok(None);
            }
            watchers.push(watcher.changed());
        }
        if watchers.is_empty() {
            return Ok(None);
        }
        let first = futures_util::future::select_all(watchers.into_iter().map(Box::pin));
        Ok(Some(Box::pin(async move { first.await.0 })))
    }
}
