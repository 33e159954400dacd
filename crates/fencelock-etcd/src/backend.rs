//! [`EtcdBackend`]: the `Backend` implementation.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions, WatchStream,
};
use fencelock_core::{
    renew_writers_batched, Acquire, AcquireAll, AcquireRequest, Backend, BackendError,
    Capabilities, ChangeFeed, Error, ErrorStatus, FencingToken, Grant, LeaseId, LockInfo, LockKey,
    LockMode, Owner, Renewal, Result, WakeSubscription, Watch,
};
use serde_json::{json, Value};

use crate::{
    error::{
        bad_value, bounded, failover, hedged, hedged_unless, is_lease_not_found, map, HEDGE_AFTER,
        NAME,
    },
    options::{Balance, EtcdOptions},
    prefer::{self, Steward},
};

mod admin;
mod queue;
mod shared;

/// Lease ids of grants this backend made, so renew and release need no read
/// first. Entries leave on release; a grant never released (its holder lost
/// it, or it was taken with `fencelock acquire`) is swept once its lease has
/// ended, whenever the cache has grown past this many entries and twice the
/// size left by the last sweep. Clearing it instead would send every held
/// lock of a large client down the slow path at once.
const LEASE_CACHE_SWEEP: usize = 4096;

/// What follows a lock key in the keys of its readers.
const READERS: &str = "\0r/";

/// What follows a lock key in the key of a waiting writer's intent.
pub(crate) const INTENT: &str = "\0i";

/// Numbers reader keys apart within this process (see
/// `EtcdBackend::acquire_reader`).
static NEXT_READER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most operations etcd accepts in one Txn by default (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// A grant made here: its lease, the TTL in seconds asked for when that
/// lease was granted or last renewed (etcd may have granted more), and the
/// display expiry computed from the local clock then (so repeated
/// `inspect`s show a stable time instead of re-deriving it from
/// whole-second TTLs).
#[derive(Clone, Copy)]
struct Cached {
    lease: i64,
    asked: i64,
    expires_at: DateTime<Utc>,
}

/// The grants this backend made (see [`LEASE_CACHE_SWEEP`]).
#[derive(Default)]
struct LeaseCache {
    grants: HashMap<LeaseId, Cached>,
    /// Size at which the next sweep of ended grants runs.
    sweep_at: usize,
}

impl LeaseCache {
    fn insert(&mut self, lease: LeaseId, cached: Cached) {
        if self.grants.len() >= self.sweep_at.max(LEASE_CACHE_SWEEP) {
            let now = Utc::now();
            self.grants.retain(|_, c| c.expires_at > now);
            self.sweep_at = self.grants.len() * 2;
        }
        self.grants.insert(lease, cached);
    }
}

/// The etcd lease that the grants of one TTL share: its id, the TTL etcd
/// granted (seconds), and the local instant just before the grant or the
/// last keep-alive that etcd answered was sent. The lease ends no earlier
/// than `refreshed + granted` (etcd counts from when the request arrived).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedLease {
    /// The lease's id.
    pub(crate) id: i64,
    pub(crate) granted: i64,
    pub(crate) refreshed: Instant,
}

impl SharedLease {
    /// How long the lease lasts at least from now, on the local clock.
    pub(crate) fn left(&self) -> Duration {
        secs(self.granted).saturating_sub(self.refreshed.elapsed())
    }
}

/// Locks in etcd. Cheap to clone; clones share the gRPC channel and the
/// shared leases.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) client: Client,
    /// With `balance=first`, what keeps `client` on its first endpoint
    /// that answers.
    _steward: Option<Steward>,
    pub(crate) options: Arc<EtcdOptions>,
    leases: Arc<Mutex<LeaseCache>>,
    /// The lease new grants join, per asked TTL in seconds.
    shared: Arc<Mutex<HashMap<i64, SharedLease>>>,
    /// The lease new queue entries join, per asked TTL in seconds
    /// (`queue.rs`): never kept alive, so an entry outlives its waiter's
    /// last attempt by at most one TTL.
    queue_leases: Arc<Mutex<HashMap<i64, SharedLease>>>,
    /// The create revision of each queue entry this backend's waiters
    /// hold (their place), by entry key.
    pub(crate) positions: Arc<Mutex<HashMap<String, i64>>>,
    /// The store's change feeds and their one watch (`changes.rs`).
    pub(crate) changes: Arc<fencelock_core::WatchedHub>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Builds a client for `options` (shared with the fence), and with
/// `balance=first` the steward that keeps it on the first endpoint that
/// answers (stopped when the last clone of the returned guard goes).
pub(crate) async fn connect(options: &EtcdOptions) -> Result<(Client, Option<Steward>)> {
    let mut connect = ConnectOptions::new()
        .with_timeout(options.timeout)
        .with_connect_timeout(options.timeout)
        .with_keep_alive(Duration::from_secs(5), options.timeout);
    if let Some((user, password)) = &options.user {
        connect = connect.with_user(user.clone(), password.clone());
    }
    #[cfg(feature = "tls")]
    if options.tls {
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &options.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| Error::InvalidUrl(format!("cannot read the CA file: {e}")))?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        if let Some(domain) = &options.domain {
            tls = tls.domain_name(domain.clone());
        }
        connect = connect.with_tls(tls);
    }
    // The client connects lazily; a status request proves now, within the
    // timeout, that a server answers, rather than letting the first lock
    // operation (or a waiter's watch, which the wait's deadline does not
    // bound) find out.
    let timeout = options.timeout;
    let (client, steward) = match options.balance {
        // One endpoint: nothing to move to.
        Balance::All if options.endpoints.len() == 1 => (
            bounded(timeout, Client::connect(&options.endpoints, Some(connect)))
                .await
                .map_err(|e| map("connect", e))?,
            None,
        ),
        Balance::All => {
            let (client, steward) =
                prefer::connect_all(&options.endpoints, connect, timeout).await?;
            (client, Some(steward))
        }
        Balance::First => {
            let (client, steward) = prefer::connect(&options.endpoints, connect, timeout).await?;
            (client, Some(steward))
        }
    };
    let answered = hedged(timeout, copies_for(options), || {
        failover(timeout, || {
            let mut c = client.clone();
            async move { c.status().await }
        })
    })
    .await;
    if let Err(e) = answered {
        // A refusal (e.g. a user without the right to ask for the status)
        // is an answer too: only a server that is not there fails the open.
        let e = map("connect", e);
        if e.is_transient() {
            return Err(e);
        }
    }
    Ok((client, steward))
}

/// How many copies of an idempotent request are sent at most: one per
/// member (two with a single endpoint), so that one hung member cannot
/// hold them all; with `balance=all`, as many more as go out before the
/// steward has surely taken a silent member out of the channel
/// ([`prefer::out_within`]). Until then the channel may hand every copy
/// to that member; a release whose three copies all went there waited out
/// its time-out and failed, about once in a few hundred releases sent
/// while a member was cut off.
fn copies_for(options: &EtcdOptions) -> usize {
    let members = options.endpoints.len().max(2);
    if options.balance != Balance::All || options.endpoints.len() == 1 {
        return members;
    }
    let before = prefer::out_within(options.timeout).as_millis() / HEDGE_AFTER.as_millis().max(1);
    members + usize::try_from(before).unwrap_or(usize::MAX)
}

/// Whole seconds, rounded up: etcd leases have a one-second resolution and
/// must never be shorter than asked.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A token as the create revision it is.
fn revision(token: FencingToken) -> i64 {
    i64::try_from(token.0).unwrap_or(i64::MAX)
}

pub(crate) fn secs(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

pub(crate) fn wall_in(d: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(d).unwrap_or_default()
}

/// What is stored under a lock key. `acquired_ms` is the granting client's
/// wall clock, for display and hold-time statistics only; expiry is etcd's
/// lease.
pub(crate) struct Stored {
    pub(crate) owner: Owner,
    /// The lease the grant was put on, or last moved to, by this crate.
    lease: Option<i64>,
    pub(crate) kind: Option<String>,
    pub(crate) data: Option<Value>,
    pub(crate) acquired_ms: i64,
}

pub(crate) fn decode(kv: &KeyValue) -> Result<Stored> {
    let v: Value = serde_json::from_slice(kv.value())
        .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
    let owner = v
        .get("owner")
        .and_then(Value::as_str)
        .and_then(|o| Owner::new(o).ok())
        .ok_or_else(|| bad_value("lock value has no valid owner"))?;
    Ok(Stored {
        owner,
        lease: v.get("lease").and_then(Value::as_i64),
        kind: v.get("kind").and_then(Value::as_str).map(str::to_owned),
        data: v.get("data").filter(|d| !d.is_null()).cloned(),
        acquired_ms: v.get("acquired_ms").and_then(Value::as_i64).unwrap_or(0),
    })
}

pub(crate) fn token_of(kv: &KeyValue) -> FencingToken {
    FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0))
}

impl EtcdBackend {
    /// Connects with `options`. Options with `layout=etcd` are refused:
    /// that layout is [`crate::EtcdLayoutBackend`]'s.
    pub async fn connect_with(options: EtcdOptions) -> Result<Self> {
        if options.layout != crate::Layout::Fencelock {
            return Err(Error::InvalidUrl(
                "layout=etcd is opened with EtcdLayoutBackend (or the driver)".into(),
            ));
        }
        Self::open(options).await
    }

    /// Connects with `options`, whatever their layout (the etcd layout
    /// runs its requests through one of these).
    pub(crate) async fn open(options: EtcdOptions) -> Result<Self> {
        let (client, steward) = connect(&options).await?;
        Ok(Self {
            client,
            _steward: steward,
            options: Arc::new(options),
            leases: Arc::default(),
            shared: Arc::default(),
            queue_leases: Arc::default(),
            positions: Arc::default(),
            changes: Arc::default(),
        })
    }

    /// Connects to `url` (see [`EtcdOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(EtcdOptions::from_url(url)?).await
    }

    /// The options in use.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    pub(crate) fn locks_prefix(&self) -> String {
        format!("{}/locks/", self.options.prefix)
    }

    pub(crate) fn key(&self, key: &LockKey) -> String {
        format!("{}{}", self.locks_prefix(), key.as_str())
    }

    fn user_key(&self, kv: &KeyValue) -> Option<LockKey> {
        let raw = std::str::from_utf8(kv.key()).ok()?;
        LockKey::new(raw.strip_prefix(&self.locks_prefix())?).ok()
    }

    /// Where reader leases live (docs/rwlock.md): `P/locks/K\0r/<name>`,
    /// beside the writer's `P/locks/K` and the intent `P/locks/K\0i`. Keys
    /// hold no NUL, so these never collide with another key's, a range
    /// of the lock keys holds them too (`user_key` skips them), and one
    /// watch of `[P/locks/K, P/locks/K\x01)` sees every release of the key.
    fn readers_prefix(&self, key: &LockKey) -> String {
        format!("{}{READERS}", self.key(key))
    }

    /// A waiting writer's intent on `key`: its owner, on a lease.
    fn intent_key(&self, key: &LockKey) -> String {
        format!("{}{INTENT}", self.key(key))
    }

    /// The user key of a reader's key.
    fn reader_user_key(&self, kv: &KeyValue) -> Option<LockKey> {
        let raw = std::str::from_utf8(kv.key()).ok()?;
        let (key, _) = raw
            .strip_prefix(&self.locks_prefix())?
            .split_once(READERS)?;
        LockKey::new(key).ok()
    }

    /// The reader key of `lease` as it is now, if it is that (owner,
    /// token)'s grant on the lease this crate put it on.
    async fn reader(&self, lease: &LeaseId) -> Result<Option<KeyValue>> {
        let mut resp = self.range(self.readers_prefix(&lease.key)).await?;
        for kv in resp.take_kvs() {
            if token_of(&kv) != lease.token {
                continue;
            }
            let stored = decode(&kv)?;
            if stored.owner == lease.owner && stored.lease.is_none_or(|l| l == kv.lease()) {
                return Ok(Some(kv));
            }
        }
        Ok(None)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, LeaseCache> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, grant: &LeaseId, lease: i64, asked: i64, expires_at: DateTime<Utc>) {
        let cached = Cached {
            lease,
            asked,
            expires_at,
        };
        let mut cache = self.cache();
        match cache.grants.get_mut(grant) {
            Some(entry) => *entry = cached,
            None => cache.insert(grant.clone(), cached),
        }
    }

    /// How many copies of an idempotent request are sent at most
    /// ([`copies_for`]).
    fn copies(&self) -> usize {
        copies_for(&self.options)
    }

    /// What this backend remembers of a grant it made or renewed.
    fn cached(&self, grant: &LeaseId) -> Option<Cached> {
        self.cache().grants.get(grant).copied()
    }

    fn forget(&self, grant: &LeaseId) -> bool {
        self.cache().grants.remove(grant).is_some()
    }

    /// The key as it is now if it is (owner, token)'s grant, on the lease
    /// this crate put it on or moved it to; `None` when the key is gone, is
    /// another grant, or was attached to another lease by someone else.
    async fn current_grant(
        &self,
        key: &LockKey,
        owner: &Owner,
        token: FencingToken,
    ) -> Result<Option<KeyValue>> {
        let Some(kv) = self.get(key).await? else {
            return Ok(None);
        };
        Ok(self.carries_grant(&kv, owner, token)?.then_some(kv))
    }

    /// Whether `kv` is (owner, token)'s grant, on the lease this crate put
    /// it on or moved it to.
    fn carries_grant(&self, kv: &KeyValue, owner: &Owner, token: FencingToken) -> Result<bool> {
        let stored = decode(kv)?;
        Ok(token_of(kv) == token
            && stored.owner == *owner
            && stored.lease.is_none_or(|l| l == kv.lease()))
    }

    async fn get(&self, key: &LockKey) -> Result<Option<KeyValue>> {
        let full = self.key(key);
        let timeout = self.options.timeout;
        let mut resp = hedged(timeout, self.copies(), || {
            failover(timeout, || {
                let (mut c, k) = (self.client.clone(), full.clone());
                async move { c.get(k, None).await }
            })
        })
        .await
        .map_err(|e| map("get", e))?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// One keep-alive round trip: the lease's TTL in seconds (to which it
    /// was just extended), `None` when the lease is gone. A shared lease
    /// that answers is remembered as refreshed from before the request.
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<Option<i64>> {
        let sent = Instant::now();
        let timeout = self.options.timeout;
        // Keeping a lease alive twice is keeping it alive once. A copy
        // every HEDGE_AFTER for as long as the time-out allows: while the
        // leader is stopped, the copies a follower holds wait for it, and
        // the first copy sent once another member leads is the one that
        // answers.
        let copies = usize::try_from(timeout.as_millis() / HEDGE_AFTER.as_millis().max(1))
            .unwrap_or(usize::MAX)
            .max(self.copies());
        let kept = hedged(timeout, copies, || {
            let client = self.client.clone();
            async move {
                let (mut keeper, mut stream) = failover(timeout, || {
                    let mut c = client.clone();
                    async move { c.lease_keep_alive(lease).await }
                })
                .await?;
                keeper.keep_alive().await?;
                match stream.message().await? {
                    Some(resp) => Ok(resp.ttl()),
                    None => Err(etcd_client::Error::LeaseKeepAliveError(
                        "keep-alive stream closed without an answer".into(),
                    )),
                }
            }
        })
        .await;
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match kept {
            Ok(ttl) if ttl > 0 => {
                if let Some(entry) = shared.values_mut().find(|l| l.id == lease) {
                    entry.granted = ttl;
                    entry.refreshed = entry.refreshed.max(sent);
                }
                Ok(Some(ttl))
            }
            Ok(_) => {
                tracing::debug!(lease, "keep-alive: the lease has ended");
                shared.retain(|_, l| l.id != lease);
                Ok(None)
            }
            Err(e) if is_lease_not_found(&e) => {
                tracing::debug!(lease, "keep-alive: lease not found");
                shared.retain(|_, l| l.id != lease);
                Ok(None)
            }
            Err(e) => Err(map("lease keep-alive", e)),
        }
    }

    /// The shared lease for grants that ask for `ttl` seconds, granted on
    /// first use, or again once less than half of it is left: a grant that
    /// joins a lease ends with it, so the lease must still have most of its
    /// TTL ahead. `fresh` is true when granted by this call.
    async fn shared_lease(&self, ttl: i64) -> Result<(SharedLease, bool)> {
        self.lease_of(&self.shared, ttl).await
    }

    /// The lease queue entries of `ttl` seconds join, on the same terms as
    /// [`Self::shared_lease`], but never kept alive by renewals.
    pub(crate) async fn queue_lease(&self, ttl: i64) -> Result<(SharedLease, bool)> {
        self.lease_of(&self.queue_leases, ttl).await
    }

    async fn lease_of(
        &self,
        pool: &Mutex<HashMap<i64, SharedLease>>,
        ttl: i64,
    ) -> Result<(SharedLease, bool)> {
        let current = pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&ttl)
            .copied();
        if let Some(lease) = current.filter(|l| l.left() * 2 >= secs(l.granted)) {
            return Ok((lease, false));
        }
        let refreshed = Instant::now();
        let granted = failover(self.options.timeout, || {
            let mut c = self.client.clone();
            async move { c.lease_grant(ttl, None).await }
        })
        .await
        .map_err(|e| map("lease grant", e))?;
        let lease = SharedLease {
            id: granted.id(),
            granted: granted.ttl(),
            refreshed,
        };
        pool.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ttl, lease);
        Ok((lease, true))
    }

    /// Stops new grants from joining `lease` (it ended, or a write to it
    /// has an unknown outcome); its grants keep it until they are gone.
    fn retire(&self, lease: i64) {
        for pool in [&self.shared, &self.queue_leases] {
            pool.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|_, l| l.id != lease);
        }
    }

    /// Runs `txn`.
    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        failover(self.options.timeout, || {
            let (mut c, t) = (self.client.clone(), txn.clone());
            async move { c.txn(t).await }
        })
        .await
        .map_err(|e| map(what, e))
    }

    /// Whether `full` is still the key created at revision `token` and
    /// attached to `lease`: the grant is alive exactly as long as that lease
    /// carries it.
    async fn carries(&self, full: &[u8], token: FencingToken, lease: i64) -> Result<bool> {
        let txn = Txn::new().when([
            Compare::create_revision(full.to_vec(), CompareOp::Equal, revision(token)),
            Compare::lease(full.to_vec(), CompareOp::Equal, lease),
        ]);
        Ok(self.read_txn("renewal check txn", txn).await?.succeeded())
    }

    /// Runs `txn`, which only compares and reads: it may be sent twice, so
    /// it is [`hedged`] against a member that does not answer.
    pub(crate) async fn read_txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        let timeout = self.options.timeout;
        hedged(timeout, self.copies(), || {
            failover(timeout, || {
                let (mut c, t) = (self.client.clone(), txn.clone());
                async move { c.txn(t).await }
            })
        })
        .await
        .map_err(|e| map(what, e))
    }

    /// Moves the grant `kv` (as just read) to this backend's shared lease
    /// of `ttl` seconds: the key keeps its create revision, hence its token,
    /// and its value records the new lease. The target lease is kept alive
    /// first, so the grant lasts its TTL from before this call.
    /// `Some((lease, granted ttl))` once moved, `None` when the key changed
    /// since it was read. The old lease is left alone: other grants may
    /// share it, and without them it simply expires.
    async fn move_to_shared(&self, kv: &KeyValue, ttl: i64) -> Result<Option<(i64, i64)>> {
        let (target, fresh) = self.shared_lease(ttl).await?;
        let granted = if fresh {
            target.granted
        } else {
            match self.keep_alive(target.id).await? {
                Some(granted) => granted,
                // Ended between the two calls: a new one next time.
                None => {
                    return Err(BackendError::message(
                        NAME,
                        ErrorStatus::Transient,
                        "the shared lease ended while a grant moved to it",
                    )
                    .into())
                }
            }
        };
        let full = kv.key().to_vec();
        let moved = if kv.lease() == target.id {
            self.carries(&full, token_of(kv), target.id).await?
        } else {
            let mut value: Value = serde_json::from_slice(kv.value())
                .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
            value["lease"] = json!(target.id);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(full.clone(), CompareOp::Equal, kv.create_revision()),
                    Compare::mod_revision(full.clone(), CompareOp::Equal, kv.mod_revision()),
                ])
                .and_then([TxnOp::put(
                    full,
                    value.to_string(),
                    Some(PutOptions::new().with_lease(target.id)),
                )]);
            self.txn("lease move txn", txn).await?.succeeded()
        };
        Ok(moved.then_some((target.id, granted)))
    }

    /// Renews the grant on `lease`, which this backend put it on: one
    /// keep-alive, then the proof that the key still carries this grant on
    /// that lease. `Some(granted ttl)`, or `None` when it does not.
    ///
    /// The keep-alive comes first and the check second: a live lease alone
    /// proves nothing (deleting the key leaves its lease alive), and a check
    /// before the keep-alive would leave the key's removal in between
    /// unnoticed. The core's send instant precedes both requests, so the
    /// guard's deadline (I5) counts from before the keep-alive.
    async fn renew_kept(&self, full: &str, token: FencingToken, lease: i64) -> Result<Option<i64>> {
        let Some(granted) = self.keep_alive(lease).await? else {
            return Ok(None);
        };
        Ok(self
            .carries(full.as_bytes(), token, lease)
            .await?
            .then_some(granted))
    }

    /// Deletes `full` if it is still the key created at revision `token`;
    /// whether it was.
    pub(crate) async fn delete_grant(&self, full: &str, token: FencingToken) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                full,
                CompareOp::Equal,
                revision(token),
            )])
            .and_then([TxnOp::delete(full, None)]);
        // Conditional on the incarnation, so two copies delete it once: sent
        // again beside a member that does not answer, as reads are. Without
        // that, a release through a stopped or cut-off member waited out its
        // whole time-out and failed.
        let timeout = self.options.timeout;
        let answer = hedged_unless(
            timeout,
            self.copies(),
            || {
                failover(timeout, || {
                    let (mut c, t) = (self.client.clone(), txn.clone());
                    async move { c.txn(t).await }
                })
            },
            |r: &TxnResponse| !r.succeeded(),
        )
        .await
        .map_err(|e| map("delete txn", e))?;
        Ok(answer.succeeded())
    }

    /// The lease's remaining TTL; `None` when it has ended.
    pub(crate) async fn remaining(&self, lease: i64) -> Result<Option<Duration>> {
        let ttl = failover(self.options.timeout, || {
            let mut c = self.client.clone();
            async move { c.lease_time_to_live(lease, None).await }
        })
        .await;
        match ttl {
            Ok(r) if r.ttl() >= 0 => Ok(Some(secs(r.ttl()))),
            Ok(_) => Ok(None),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(map("lease time-to-live", e)),
        }
    }

    /// A lease as [`LockInfo`], or `None` if its lease has ended.
    async fn info(&self, key: LockKey, kv: &KeyValue) -> Result<Option<(LockInfo, i64)>> {
        let Some(left) = self.remaining(kv.lease()).await? else {
            return Ok(None);
        };
        // TimeToLive reports whole seconds, rounded down; a key that still
        // exists has not expired, so report at least a millisecond.
        self.describe(key, kv, left.max(Duration::from_millis(1)))
            .map(Some)
    }

    /// The grant `kv` of `key` as [`LockInfo`], its lease having `left` to
    /// run, with its acquisition time in ms.
    pub(crate) fn describe(
        &self,
        key: LockKey,
        kv: &KeyValue,
        left: Duration,
    ) -> Result<(LockInfo, i64)> {
        let stored = decode(kv)?;
        let token = token_of(kv);
        let grant = LeaseId::new(key, stored.owner, token);
        let expires_at = self
            .cached(&grant)
            .filter(|c| c.lease == kv.lease())
            .map_or_else(|| wall_in(left), |c| c.expires_at);
        let info = LockInfo {
            key: grant.key,
            owner: grant.owner,
            token,
            kind: stored.kind,
            data: stored.data,
            acquired_at: DateTime::from_timestamp_millis(stored.acquired_ms).unwrap_or_default(),
            expires_at,
            expires_in: left,
            mode: if kv
                .key()
                .windows(READERS.len())
                .any(|w| w == READERS.as_bytes())
            {
                LockMode::Shared
            } else {
                LockMode::Exclusive
            },
        };
        Ok((info, stored.acquired_ms))
    }

    /// An etcd watch of `key` with `options`, once etcd confirmed it was
    /// created, so that a change right after this returns is not missed.
    pub(crate) async fn open_watch(
        &self,
        key: &LockKey,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        self.open_watch_at(self.key(key), options).await
    }

    /// [`Self::open_watch`] of the etcd key `full` as it is.
    pub(crate) async fn open_watch_at(
        &self,
        full: String,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        let mut stream = failover(self.options.timeout, || {
            let (mut c, k, o) = (self.client.clone(), full.clone(), options.clone());
            async move { c.watch(k, Some(o)).await }
        })
        .await
        .map_err(|e| map("watch", e))?;
        bounded(self.options.timeout, stream.message())
            .await
            .map_err(|e| map("watch", e))?
            .ok_or_else(|| bad_value("watch closed before it was created"))?;
        Ok(stream)
    }

    /// Takes every key of `requests` for its writer in one Txn, or none:
    /// each key must be free of a holder and of readers (docs/rwlock.md),
    /// and each grant withdraws its owner's intent (a nested Txn). When a
    /// compare fails, the `or_else` reads (each key's holder, then one of
    /// its readers) name the first key held.
    async fn acquire_writers(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let mut when = Vec::with_capacity(3 * requests.len());
        let mut withdraw = Vec::with_capacity(requests.len());
        let mut or_else = Vec::with_capacity(2 * requests.len());
        for request in requests {
            let key = self.key(&request.key);
            let readers = self.readers_prefix(&request.key);
            let intent = self.intent_key(&request.key);
            // A range compare holds for an empty range.
            when.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            when.push(Compare::create_revision(readers.clone(), CompareOp::Equal, 0).with_prefix());
            // FIFO (queue.rs): only the oldest waiter, or anyone when
            // nobody waits.
            when.extend(self.queue_turn(request));
            withdraw.extend(self.queue_on_grant(request));
            withdraw.push(TxnOp::txn(
                Txn::new()
                    .when([Compare::value(
                        intent.clone(),
                        CompareOp::Equal,
                        request.owner.as_str(),
                    )])
                    .and_then([TxnOp::delete(intent, None)]),
            ));
            or_else.push(TxnOp::get(key, None));
            or_else.push(TxnOp::get(
                readers,
                Some(GetOptions::new().with_prefix().with_limit(1)),
            ));
        }
        // Only single tries of a wait queue (the client's `lock_all` never
        // does); a refusal posts or refreshes the waiter's entry.
        let queued = match requests {
            [request] if request.queue => Some(request),
            _ => None,
        };
        if let Some(request) = queued {
            or_else.push(self.queue_refresh(request).await?);
        }
        let refused = match self
            .put_grants(
                requests,
                |request, _| self.key(&request.key),
                &when,
                &withdraw,
                &or_else,
                true,
            )
            .await?
        {
            Ok(grants) => {
                if let Some(request) = queued {
                    self.queue_forget(&request.key, &request.owner);
                }
                return Ok(AcquireAll::Granted(grants));
            }
            Err(resp) => resp,
        };
        let mut answers = refused.op_responses();
        if let Some(request) = queued {
            if let Some(entry) = answers.pop() {
                self.queue_noted(request, entry);
            }
        }
        // Two reads per key, in order: the first key with a holder (the
        // writer if any, else a reader) is the one that refused. With none
        // (a free key with waiters ahead), the caller waits its turn.
        let reads: Vec<Option<KeyValue>> = answers
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                _ => None,
            })
            .collect();
        let found = reads
            .chunks(2)
            .enumerate()
            .find_map(|(index, pair)| pair.iter().flatten().next().map(|kv| (index, kv)));
        let Some((index, kv)) = found else {
            // The reads run in the Txn whose compare failed, so one of
            // them finds the key; should none, the first key is named
            // without a holder.
            return Ok(AcquireAll::Held {
                index: 0,
                holder: None,
            });
        };
        let holder = match requests.get(index) {
            Some(request) => self.info(request.key.clone(), kv).await?.map(|(i, _)| i),
            None => None,
        };
        Ok(AcquireAll::Held { index, holder })
    }

    /// Puts `request`'s grant, under the key `name` gives for the shared
    /// lease it joins, when every compare of `when` holds, with `extra` ops;
    /// `Err(response)` (of the `or_else` reads) when one does not. Whether a
    /// writer's (`remember`: into the lease cache) or a reader's.
    async fn put_grant(
        &self,
        request: &AcquireRequest,
        name: impl Fn(i64) -> String,
        when: &[Compare],
        extra: &[TxnOp],
        or_else: &[TxnOp],
        remember: bool,
    ) -> Result<std::result::Result<Grant, TxnResponse>> {
        let requests = std::slice::from_ref(request);
        let put = self
            .put_grants(requests, |_, id| name(id), when, extra, or_else, remember)
            .await?;
        match put {
            Ok(mut grants) => grants
                .pop()
                .map(Ok)
                .ok_or_else(|| bad_value("a txn of one grant granted none")),
            Err(resp) => Ok(Err(resp)),
        }
    }

    /// [`Self::put_grant`] for several requests of one TTL in one Txn: every
    /// grant is put, on one shared lease and at one revision (each key's
    /// token), or none is.
    async fn put_grants(
        &self,
        requests: &[AcquireRequest],
        name: impl Fn(&AcquireRequest, i64) -> String,
        when: &[Compare],
        extra: &[TxnOp],
        or_else: &[TxnOp],
        remember: bool,
    ) -> Result<std::result::Result<Vec<Grant>, TxnResponse>> {
        let Some(first) = requests.first() else {
            return Ok(Ok(Vec::new()));
        };
        let asked = ttl_secs(first.ttl);
        if requests.iter().any(|r| ttl_secs(r.ttl) != asked) {
            return Err(Error::unsupported(
                NAME,
                "one Txn for leases of different TTLs",
            ));
        }
        // A lease that ended on the server before this backend noticed
        // (nobody renewed it) refuses the put; a new one is granted once.
        let mut attempts = 2;
        loop {
            attempts -= 1;
            let (lease, fresh) = self.shared_lease(asked).await?;
            let puts: Vec<(String, String)> = requests
                .iter()
                .map(|request| {
                    let value = json!({
                        "owner": request.owner.as_str(),
                        "lease": lease.id,
                        "kind": request.kind,
                        "data": request.data,
                        "acquired_ms": Utc::now().timestamp_millis(),
                    })
                    .to_string();
                    (name(request, lease.id), value)
                })
                .collect();
            // The grant ends with the shared lease: what is left of it,
            // measured from before this call, is the TTL granted (all of
            // it when granted by this call, after the caller's send
            // instant).
            let granted = if fresh {
                secs(lease.granted)
            } else {
                lease.left()
            };
            let mut ops: Vec<TxnOp> = puts
                .iter()
                .map(|(key, value)| {
                    TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease.id)),
                    )
                })
                .collect();
            ops.extend_from_slice(extra);
            let txn = Txn::new()
                .when(when.to_vec())
                .and_then(ops)
                .or_else(or_else.to_vec());
            let sent = failover(self.options.timeout, || {
                let (mut c, t) = (self.client.clone(), txn.clone());
                async move { c.txn(t).await }
            })
            .await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(e) if is_lease_not_found(&e) => {
                    self.retire(lease.id);
                    // Or the queue entry's lease ended (`queue.rs`): the
                    // next attempt's refusal puts it on a new one.
                    self.queue_leases
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clear();
                    if attempts > 0 {
                        continue;
                    }
                    return Err(BackendError::transient(
                        NAME,
                        "the shared lease expired before the put-if-absent txn",
                        e,
                    )
                    .into());
                }
                Err(e) => {
                    // The puts may have happened (all of them, or none: one
                    // Txn). Left there, the keys would live as long as the
                    // shared lease, i.e. as long as the other grants on it
                    // are renewed: delete them if they are exactly what this
                    // call wrote, and let no new grant join that lease, so it
                    // ends with its current grants.
                    self.retire(lease.id);
                    let mut same = Vec::with_capacity(2 * puts.len());
                    for (key, value) in &puts {
                        same.push(Compare::value(key.clone(), CompareOp::Equal, value.clone()));
                        same.push(Compare::lease(key.clone(), CompareOp::Equal, lease.id));
                    }
                    let undo = Txn::new().when(same).and_then(
                        puts.iter()
                            .map(|(key, _)| TxnOp::delete(key.clone(), None))
                            .collect::<Vec<_>>(),
                    );
                    if let Err(undo) = self.txn("undo txn", undo).await {
                        tracing::debug!(error = %undo, "undoing an unconfirmed etcd grant failed");
                    }
                    return Err(map("put-if-absent txn", e));
                }
            };
            if resp.succeeded() {
                let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                let token = FencingToken(u64::try_from(revision).unwrap_or(0));
                if token.0 == 0 {
                    return Err(bad_value("txn response without a revision"));
                }
                let expires_at = wall_in(granted);
                if remember {
                    let mut cache = self.cache();
                    for request in requests {
                        cache.insert(
                            request.lease(token),
                            Cached {
                                lease: lease.id,
                                asked,
                                expires_at,
                            },
                        );
                    }
                }
                return Ok(Ok(requests
                    .iter()
                    .map(|_| Grant::new(token, granted, expires_at))
                    .collect()));
            }
            return Ok(Err(resp));
        }
    }

    /// The live reader of `key` whose lease ends last.
    async fn last_reader(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let mut resp = self.range(self.readers_prefix(key)).await?;
        let kvs = resp.take_kvs();
        let infos = futures_util::future::join_all(kvs.iter().map(|kv| self.info(key.clone(), kv)));
        let mut last: Option<LockInfo> = None;
        for info in infos.await {
            if let Some((info, _)) = info? {
                if last.as_ref().is_none_or(|l| info.expires_in > l.expires_in) {
                    last = Some(info);
                }
            }
        }
        Ok(last)
    }

    /// Every lock key starting with `start` (a literal prefix).
    pub(crate) async fn range(&self, start: String) -> Result<etcd_client::GetResponse> {
        failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), start.clone());
            async move { c.get(k, Some(GetOptions::new().with_prefix())).await }
        })
        .await
        .map_err(|e| map("range", e))
    }

    async fn scan(&self, prefix: Option<&str>) -> Result<Vec<(LockInfo, i64)>> {
        let start = format!("{}{}", self.locks_prefix(), prefix.unwrap_or(""));
        let mut resp = self.range(start).await?;
        let kvs = resp.take_kvs();
        // Writers and readers; intents are no leases.
        let lookups = kvs.iter().filter_map(|kv| {
            let key = self.user_key(kv).or_else(|| self.reader_user_key(kv))?;
            Some(self.info(key, kv))
        });
        let mut found = Vec::new();
        for r in futures_util::future::join_all(lookups).await {
            if let Some(entry) = r? {
                found.push(entry);
            }
        }
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key).then(a.0.token.cmp(&b.0.token)));
        Ok(found)
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_wakeups(true)
            .with_persistent(true)
            .with_batch_renew(true)
            .with_watch(true)
            .with_set_data(true)
            .with_shared(true)
            .with_atomic_multi(true)
            .with_fair(true)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if request.mode == LockMode::Shared {
            return self.acquire_reader(request).await;
        }
        let requests = std::slice::from_ref(request);
        Ok(match self.acquire_writers(requests).await? {
            AcquireAll::Granted(mut grants) => match grants.pop() {
                Some(grant) => Acquire::Granted(grant),
                None => return Err(bad_value("a txn of one grant granted none")),
            },
            AcquireAll::Held { holder, .. } => Acquire::Held(holder),
        })
    }

    /// One Txn for every key (see `acquire_writers`); sets too large
    /// for one Txn are taken one by one by the client.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        // Each key costs three compares and two operations in each branch
        // of the Txn; etcd refuses more than `--max-txn-ops` (128 by
        // default) in any of them.
        if requests.len() * 3 > MAX_TXN_OPS {
            return Err(Error::unsupported(
                NAME,
                "more keys in one Txn than etcd's default --max-txn-ops allows",
            ));
        }
        self.acquire_writers(requests).await
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        if lease.mode == LockMode::Shared {
            return self.renew_reader(lease, ttl).await;
        }
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let ttl = ttl_secs(ttl);
        let renewed = |etcd_lease: i64, granted: i64| {
            let granted = secs(granted);
            let expires_at = wall_in(granted);
            self.remember(lease, etcd_lease, ttl, expires_at);
            Grant::new(token, granted, expires_at)
        };
        // Granted here with this TTL: keep its lease alive.
        if let Some(c) = self.cached(lease).filter(|c| c.asked == ttl) {
            if let Some(granted) = self.renew_kept(&self.key(key), token, c.lease).await? {
                return Ok(renewed(c.lease, granted));
            }
            self.forget(lease);
        }
        // Another TTL, a grant made elsewhere, or one that has left the
        // remembered lease (another process renewed it with another TTL):
        // move it to this backend's lease of that TTL, so that renewing it
        // never keeps another process's lease (and its grants) alive.
        match self.get(key).await? {
            Some(kv) if self.carries_grant(&kv, owner, token)? => {
                if let Some((etcd_lease, granted)) = self.move_to_shared(&kv, ttl).await? {
                    return Ok(renewed(etcd_lease, granted));
                }
                tracing::debug!(%key, %token, "renewal: the grant changed as it moved leases");
            }
            found => tracing::debug!(
                %key, %token,
                found = ?found.map(|kv| (kv.create_revision(), kv.lease())),
                "renewal: the key no longer carries this grant"
            ),
        }
        Err(Error::not_held(lease))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        if lease.mode == LockMode::Shared {
            return self.release_reader(lease).await;
        }
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        // Deleting the key (only the incarnation created at `token`) ends
        // this grant alone; the shared lease goes on for the others, or
        // expires when none is left. The DELETE event wakes the watchers.
        let full = self.key(key);
        if self.forget(lease) {
            return lease.found(self.delete_grant(&full, token).await?);
        }
        // Not granted here: the owner must be checked by reading the key.
        let deleted = match self.current_grant(key, owner, token).await? {
            Some(_) => self.delete_grant(&full, token).await?,
            None => false,
        };
        lease.found(deleted)
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<Value>) -> Result<()> {
        // Read, then one Txn that puts the new value only if the key is still
        // that read's incarnation (create_revision = token) and unchanged
        // since (mod_revision, so the same owner and etcd lease). The Put
        // names the same lease, so the grant's expiry and token stay. A
        // concurrent move to another shared lease by the holder's own
        // renewal changes mod_revision: read again, a few times.
        for _ in 0..3 {
            let Some(kv) = self
                .current_grant(&lease.key, &lease.owner, lease.token)
                .await?
            else {
                return Err(Error::not_held(lease));
            };
            let mut value: Value = serde_json::from_slice(kv.value())
                .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
            value["data"] = data.clone().unwrap_or(Value::Null);
            let full = kv.key().to_vec();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(full.clone(), CompareOp::Equal, revision(lease.token)),
                    Compare::mod_revision(full.clone(), CompareOp::Equal, kv.mod_revision()),
                ])
                .and_then([TxnOp::put(
                    full,
                    value.to_string(),
                    Some(PutOptions::new().with_lease(kv.lease())),
                )]);
            if self.txn("set_data txn", txn).await?.succeeded() {
                return Ok(());
            }
        }
        Err(BackendError::message(
            NAME,
            ErrorStatus::Transient,
            "the lease kept changing while its data was set",
        )
        .into())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        if let Some(kv) = self.get(key).await? {
            return Ok(self.info(key.clone(), &kv).await?.map(|(i, _)| i));
        }
        self.last_reader(key).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        // The writer's key and everything after it up to `K\x01`: its
        // readers and intent, so a reader's release wakes a waiting writer
        // and a withdrawn intent waiting readers.
        let end = format!("{}\u{1}", self.key(key));
        let options = WatchOptions::new()
            .with_filters([WatchFilterType::NoPut])
            .with_range(end);
        let stream = self.open_watch(key, options).await?;
        Ok(Some(delete_wakeups(stream)))
    }

    async fn watch(&self, key: &LockKey) -> Result<Watch> {
        crate::watch::watch(self, key).await
    }

    async fn changes(&self) -> Result<Option<ChangeFeed>> {
        Ok(Some(crate::changes::feed(self).await?))
    }

    fencelock_core::offers!(admin, fair_queue, write_intents);

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        // Readers have no batch statement: one renewal each.
        renew_writers_batched(self, renewals, |batch| async move {
            self.renew_writers(&batch).await
        })
        .await
    }
}

impl EtcdBackend {
    async fn renew_writers(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        // Grants made here and renewed with the TTL they have: one
        // keep-alive per distinct lease, then one Txn reading every key.
        // The rest (another TTL, unknown grants) go the way of `renew`.
        let known: Vec<Option<Cached>> = renewals
            .iter()
            .map(|r| self.cached(&r.lease).filter(|c| c.asked == ttl_secs(r.ttl)))
            .collect();
        let mut ids: Vec<i64> = known.iter().flatten().map(|c| c.lease).collect();
        ids.sort_unstable();
        ids.dedup();
        let kept = futures_util::future::join_all(ids.iter().map(|&id| self.keep_alive(id))).await;
        let kept: HashMap<i64, Result<Option<i64>>> = ids.into_iter().zip(kept).collect();
        let fast: Vec<usize> = (0..renewals.len())
            .filter(|&i| known[i].is_some_and(|c| matches!(kept.get(&c.lease), Some(Ok(Some(_))))))
            .collect();
        // One Txn for the batch, or one per MAX_TXN_OPS keys (sent together)
        // for a batch larger than etcd accepts in one.
        let checks = fast.chunks(MAX_TXN_OPS).map(|chunk| {
            let reads: Vec<TxnOp> = chunk
                .iter()
                .map(|&i| TxnOp::get(self.key(&renewals[i].lease.key), None))
                .collect();
            self.read_txn("renewal check txn", Txn::new().and_then(reads))
        });
        let mut kvs: HashMap<usize, Option<KeyValue>> = HashMap::new();
        for (chunk, resp) in fast
            .chunks(MAX_TXN_OPS)
            .zip(futures_util::future::join_all(checks).await)
        {
            let found = resp?.op_responses().into_iter().map(|op| match op {
                TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                _ => None,
            });
            kvs.extend(chunk.iter().copied().zip(found));
        }
        let slow = (0..renewals.len())
            .filter(|i| known[*i].is_none())
            .map(|i| {
                let r = &renewals[i];
                async move { (i, self.renew(&r.lease, r.ttl).await) }
            });
        let mut slow: HashMap<usize, Result<Grant>> = futures_util::future::join_all(slow)
            .await
            .into_iter()
            .collect();
        let mut results = Vec::with_capacity(renewals.len());
        for (i, r) in renewals.iter().enumerate() {
            if let Some(done) = slow.remove(&i) {
                results.push(done);
                continue;
            }
            let Some(c) = known[i] else {
                results.push(Err(bad_value("a renewal got no answer")));
                continue;
            };
            let granted = match kept.get(&c.lease) {
                Some(Ok(Some(granted))) => *granted,
                Some(Err(e)) => {
                    // One failed answer for several leases: each gets a
                    // copy, not a message that repeats "etcd backend:".
                    results.push(Err(e.duplicate(NAME)));
                    continue;
                }
                _ => {
                    // "Lease not found" is one member's lessor speaking
                    // (a woken former leader's may be behind): `renew`
                    // reads the key, linearizably, and keeps the grant
                    // (on a fresh lease) unless the key is really gone,
                    // which a revoked lease's keys are.
                    self.forget(&r.lease);
                    results.push(self.renew(&r.lease, r.ttl).await);
                    continue;
                }
            };
            let carries = kvs
                .get(&i)
                .and_then(Option::as_ref)
                .is_some_and(|kv| token_of(kv) == r.lease.token && kv.lease() == c.lease);
            if !carries {
                // Off the remembered lease: gone, or moved by another
                // process; `renew` tells which.
                self.forget(&r.lease);
                results.push(self.renew(&r.lease, r.ttl).await);
                continue;
            }
            let granted = secs(granted);
            let expires_at = wall_in(granted);
            self.remember(&r.lease, c.lease, c.asked, expires_at);
            results.push(Ok(Grant::new(r.lease.token, granted, expires_at)));
        }
        Ok(results)
    }
}

/// A wake-up for every watch answer that carries a DELETE event; the
/// subscription ends with the watch.
pub(crate) fn delete_wakeups(stream: WatchStream) -> WakeSubscription {
    let wakeups = futures_util::stream::unfold(stream, |mut stream| async move {
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        return None;
                    }
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Some(((), stream));
                    }
                }
                _ => return None,
            }
        }
    });
    WakeSubscription::from_stream(wakeups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(i: u64) -> LeaseId {
        LeaseId::new(
            LockKey::new(format!("k{i}")).expect("valid key"),
            Owner::new("o").expect("valid owner"),
            FencingToken(i + 1),
        )
    }

    fn cached(expires_at: DateTime<Utc>) -> Cached {
        Cached {
            lease: 1,
            asked: 30,
            expires_at,
        }
    }

    #[test]
    fn a_full_lease_cache_sweeps_ended_grants_and_keeps_live_ones() {
        let live = Utc::now() + chrono::Duration::hours(1);
        let ended = Utc::now() - chrono::Duration::seconds(1);
        let mut cache = LeaseCache::default();
        let total = 3 * LEASE_CACHE_SWEEP as u64;
        for i in 0..total {
            // Every fourth grant was never released and has ended.
            cache.insert(grant(i), cached(if i % 4 == 0 { ended } else { live }));
        }
        for i in 0..total {
            let kept = cache.grants.contains_key(&grant(i));
            if i % 4 != 0 {
                assert!(kept, "live grant {i} was dropped from the cache");
            }
        }
        assert!(
            cache.grants.len() < total as usize,
            "ended grants were never swept"
        );
    }

    /// The worst case of a member falling silent just before a request:
    /// the channel hands it every copy until the steward has taken it out
    /// ([`prefer::out_within`]). The copies sent after that reach the
    /// others, so the request is answered. With one copy per member it
    /// failed: all three were sent within a second, all to the silent one.
    #[tokio::test(start_paused = true)]
    async fn copies_outlast_a_silent_member_s_time_in_the_channel() {
        for balance in ["", "&balance=all"] {
            let url = format!("etcd://a:1,b:1,c:1?timeout=5s{balance}");
            let options = EtcdOptions::from_url(&url).expect("valid URL");
            let sent = tokio::time::Instant::now();
            let out = sent + prefer::out_within(options.timeout);
            let answered = hedged(options.timeout, copies_for(&options), || async move {
                if tokio::time::Instant::now() < out {
                    std::future::pending::<()>().await;
                }
                Ok::<_, etcd_client::Error>(())
            })
            .await;
            assert!(answered.is_ok(), "{url}: {answered:?}");
            assert!(sent.elapsed() < options.timeout, "{url}");
        }
    }

    /// Without a steward that takes a silent member out, more copies would
    /// only add load: one per member, two with a single endpoint.
    #[test]
    fn copies_are_one_per_member_where_nothing_takes_a_silent_one_out() {
        for (url, copies) in [("etcd://a:1", 2), ("etcd://a:1,b:1,c:1?balance=first", 3)] {
            let options = EtcdOptions::from_url(url).expect("valid URL");
            assert_eq!(copies_for(&options), copies, "{url}");
        }
    }
}
