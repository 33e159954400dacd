//! [`EtcdLayoutBackend`]: locks laid out as etcd's own `concurrency`
//! package lays them out (`layout=etcd`, `docs/etcd.md`).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Error, FencingToken, Grant, LeaseId, LockInfo,
    LockKey, LockMode, Owner, Result, WakeSubscription, ELECTION_PREFIX,
};
use serde_json::{json, Value};

use crate::{
    backend::{
        decode, delete_wakeups, secs, token_of, ttl_secs, wall_in, EtcdBackend, SharedLease,
    },
    error::{bad_value, failover, is_lease_not_found, map, NAME},
    options::EtcdOptions,
};

mod admin;
mod queue;

/// A waiting acquisition's key (`NAME/<lease>`): its lease and its create
/// revision, which is its place in the queue and, once it is the oldest,
/// its token.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    lease: SharedLease,
    revision: i64,
}

/// A grant this backend made or renewed: its key (named after the lease it
/// was first put on), its lease now, the TTL in seconds asked for when that
/// lease was granted, and the display expiry of the last grant or renewal.
#[derive(Clone, Debug)]
struct Held {
    full: String,
    lease: SharedLease,
    asked: i64,
    expires_at: DateTime<Utc>,
}

/// The queued keys of this backend's waiting acquisitions, by lock and
/// owner.
type Waiters = HashMap<(LockKey, Owner), Vec<Waiter>>;

/// What [`EtcdLayoutBackend::enter`] did.
enum Entry {
    /// The contender's key is in the queue; the contenders, oldest first.
    Queued(Waiter, Vec<KeyValue>),
    /// Asked to enter only a free lock, it found these contenders.
    Busy(Vec<KeyValue>),
}

/// At most this many unused leases are kept per TTL (see
/// `EtcdLayoutBackend::spares`).
const MAX_SPARES: usize = 64;

/// Locks that `etcdctl lock`, `etcdctl elect` and Go's
/// `concurrency.Mutex` / `concurrency.Election` contend for too.
///
/// Lock `NAME` is the etcd name `NAME` (after the URL's `namespace`); an
/// election `NAME` is the etcd name `NAME` as well, as `etcdctl elect NAME`
/// names it. Each contender is a key `NAME/<its lease id in hex>` on a
/// lease of its own, the holder is the contender with the lowest create
/// revision, and the token is the holder's create revision. Opened by the
/// driver for `etcd://…?layout=etcd`, or with
/// [`EtcdLayoutBackend::connect`]. See `docs/etcd.md`.
#[derive(Clone)]
pub struct EtcdLayoutBackend {
    etcd: EtcdBackend,
    /// The grants this backend made, so renew and release need no read
    /// first.
    grants: Arc<Mutex<HashMap<LeaseId, Held>>>,
    /// Leases whose key is gone (a released grant, a lost single try), by
    /// asked TTL: the next contender of that TTL puts its key on one of
    /// them instead of granting a lease, so a lock cycle writes what
    /// `concurrency`'s does (a put and a delete). Never kept alive; one is
    /// reused only while half its TTL is left, like the default layout's
    /// shared leases.
    spares: Arc<Mutex<HashMap<i64, Vec<SharedLease>>>>,
    /// The keys this backend's waiting acquisitions keep in the queue, by
    /// lock and owner (tasks of one owner may wait on one lock at once).
    waiters: Arc<Mutex<Waiters>>,
}

impl fmt::Debug for EtcdLayoutBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLayoutBackend")
            .field("options", &self.etcd.options)
            .finish_non_exhaustive()
    }
}

/// The lease id as etcd's `concurrency` package writes it in a key (`%x`).
fn hex(lease: i64) -> String {
    format!("{lease:x}")
}

/// The user-visible owner of a contender that fencelock did not write.
fn foreign_owner(kv: &KeyValue) -> Result<Owner> {
    Owner::new(format!("etcd:{}", hex(kv.lease())))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdLayoutBackend {
    /// Connects with `options` (their layout is taken to be etcd's).
    pub async fn connect_with(options: EtcdOptions) -> Result<Self> {
        Ok(Self {
            etcd: EtcdBackend::open(options).await?,
            grants: Arc::default(),
            spares: Arc::default(),
            waiters: Arc::default(),
        })
    }

    /// Connects to `url` (see [`EtcdOptions::from_url`]); `layout=etcd` may
    /// be left out unless the URL has a `namespace`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(EtcdOptions::from_url(url)?).await
    }

    /// The options in use.
    pub fn options(&self) -> &EtcdOptions {
        &self.etcd.options
    }

    fn timeout(&self) -> Duration {
        self.etcd.options.timeout
    }

    /// The etcd lock name of `key`: an election's name without fencelock's
    /// election prefix, so that `fencelock elect NAME` and `etcdctl elect
    /// NAME` are one election.
    fn name(&self, key: &LockKey) -> String {
        let key = key.as_str();
        let name = key.strip_prefix(ELECTION_PREFIX).unwrap_or(key);
        format!("{}{name}", self.etcd.options.namespace)
    }

    /// The prefix every contender of `key` has.
    fn contenders_prefix(&self, key: &LockKey) -> String {
        format!("{}/", self.name(key))
    }

    fn contender_key(&self, key: &LockKey, lease: i64) -> String {
        format!("{}{}", self.contenders_prefix(key), hex(lease))
    }

    /// The range of `key`'s contenders, oldest first, as `concurrency`
    /// reads its owner (`WithFirstCreate`, without the limit).
    fn contenders_range(&self) -> GetOptions {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
    }

    /// Keeps only `key`'s own contenders: `NAME/<id>`, not the contenders of
    /// a lock named `NAME/sub`. (`concurrency` counts those too; leaving
    /// them out never lets fencelock hold while a `concurrency` client
    /// does, as that client's key is among the ones kept.)
    fn own_contenders(&self, key: &LockKey, kvs: Vec<KeyValue>) -> Vec<KeyValue> {
        let prefix = self.contenders_prefix(key);
        kvs.into_iter()
            .filter(|kv| {
                kv.key()
                    .strip_prefix(prefix.as_bytes())
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
            })
            .collect()
    }

    async fn contenders(&self, key: &LockKey) -> Result<Vec<KeyValue>> {
        self.contenders_read(key, self.contenders_range()).await
    }

    /// `key`'s contenders as the member asked last applied them, without
    /// asking the leader (a serializable read): no round trip beyond that
    /// member, and possibly behind the cluster.
    async fn contenders_nearby(&self, key: &LockKey) -> Result<Vec<KeyValue>> {
        self.contenders_read(key, self.contenders_range().with_serializable())
            .await
    }

    async fn contenders_read(&self, key: &LockKey, options: GetOptions) -> Result<Vec<KeyValue>> {
        let prefix = self.contenders_prefix(key);
        let mut resp = failover(self.timeout(), || {
            let (mut c, k, o) = (self.etcd.client.clone(), prefix.clone(), options.clone());
            async move { c.get(k, Some(o)).await }
        })
        .await
        .map_err(|e| map("range", e))?;
        Ok(self.own_contenders(key, resp.take_kvs()))
    }

    /// The contender `kv` of `key` as [`LockInfo`], its lease having `left`
    /// to run. A contender fencelock did not write (a `concurrency` client)
    /// has the owner `etcd:<lease id>`, its value (an election's proposal)
    /// as `data.etcd_value`, and no known acquisition time: the time of
    /// this read stands in.
    fn describe(&self, key: &LockKey, kv: &KeyValue, left: Duration) -> Result<(LockInfo, i64)> {
        let (owner, kind, data, acquired_ms) = match decode(kv) {
            Ok(stored) => (stored.owner, stored.kind, stored.data, stored.acquired_ms),
            Err(_) => {
                let value = String::from_utf8_lossy(kv.value());
                let data = (!value.is_empty()).then(|| json!({ "etcd_value": value }));
                let now = Utc::now().timestamp_millis();
                (foreign_owner(kv)?, None, data, now)
            }
        };
        let token = token_of(kv);
        // The expiry this backend computed when it granted or renewed the
        // grant, so that repeated reads show one time rather than one
        // re-derived from whole-second TTLs.
        let expires_at = lock(&self.grants)
            .get(&LeaseId::new(key.clone(), owner.clone(), token))
            .filter(|h| h.lease.id == kv.lease())
            .map_or_else(|| wall_in(left), |h| h.expires_at);
        let info = LockInfo {
            key: key.clone(),
            owner,
            token,
            kind,
            data,
            acquired_at: DateTime::from_timestamp_millis(acquired_ms).unwrap_or_default(),
            expires_at,
            expires_in: left,
            mode: LockMode::Exclusive,
        };
        Ok((info, acquired_ms))
    }

    /// `kv` as [`LockInfo`], or `None` when its lease has ended.
    async fn info(&self, key: &LockKey, kv: &KeyValue) -> Result<Option<(LockInfo, i64)>> {
        let Some(left) = self.etcd.remaining(kv.lease()).await? else {
            return Ok(None);
        };
        self.describe(key, kv, left.max(Duration::from_millis(1)))
            .map(Some)
    }

    /// The first contender whose lease is alive: the holder.
    async fn holder(&self, key: &LockKey, kvs: &[KeyValue]) -> Result<Option<LockInfo>> {
        for kv in kvs {
            if let Some((info, _)) = self.info(key, kv).await? {
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    fn value(request: &AcquireRequest) -> String {
        json!({
            "owner": request.owner.as_str(),
            "kind": request.kind,
            "data": request.data,
            "acquired_ms": Utc::now().timestamp_millis(),
        })
        .to_string()
    }

    /// Ends a lease and with it its key; a failure leaves the lease to
    /// expire on its own.
    async fn revoke(&self, lease: i64) {
        let revoked = failover(self.timeout(), || {
            let mut c = self.etcd.client.clone();
            async move { c.lease_revoke(lease).await }
        })
        .await;
        if let Err(e) = revoked {
            tracing::debug!(lease, error = %e, "lease revoke failed; it will expire");
        }
    }

    /// A lease for a new contender of `ttl` seconds: a spare with half its
    /// TTL left, else a new one.
    async fn lease_for(&self, ttl: i64) -> Result<SharedLease> {
        loop {
            let spare = lock(&self.spares).get_mut(&ttl).and_then(Vec::pop);
            match spare {
                Some(l) if l.left() * 2 >= secs(l.granted) => return Ok(l),
                // Too little left: it expires on its own.
                Some(_) => continue,
                None => break,
            }
        }
        self.grant(ttl).await
    }

    /// A new lease of `ttl` seconds.
    async fn grant(&self, ttl: i64) -> Result<SharedLease> {
        let refreshed = Instant::now();
        let granted = failover(self.timeout(), || {
            let mut c = self.etcd.client.clone();
            async move { c.lease_grant(ttl, None).await }
        })
        .await
        .map_err(|e| map("lease grant", e))?;
        Ok(SharedLease {
            id: granted.id(),
            granted: granted.ttl(),
            refreshed,
        })
    }

    /// Keeps `lease` for the next contender of `ttl` seconds; its key must
    /// be gone.
    fn spare(&self, ttl: i64, lease: SharedLease) {
        let mut spares = lock(&self.spares);
        let pool = spares.entry(ttl).or_default();
        if pool.len() < MAX_SPARES {
            pool.push(lease);
        }
    }

    /// Joins the queue of `request.key`: the key `NAME/<lease>` on a lease
    /// of the request's TTL, written in the Txn that reads the contenders
    /// (as `concurrency.Mutex` does). With `free_only`, only if the lock
    /// has no contender at all (nor does any lock named `NAME/…`): a single
    /// try that would only queue writes nothing, so of racers on a free
    /// lock one writes.
    async fn enter(&self, request: &AcquireRequest, free_only: bool) -> Result<Entry> {
        let ttl = ttl_secs(request.ttl);
        let mut lease = self.lease_for(ttl).await?;
        let mut retried = false;
        let resp = loop {
            let full = self.contender_key(&request.key, lease.id);
            let prefix = self.contenders_prefix(&request.key);
            let mut when = vec![Compare::create_revision(full.clone(), CompareOp::Equal, 0)];
            if free_only {
                // A range compare holds when every key in it satisfies it;
                // an empty range compares as one absent key.
                when.push(
                    Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix(),
                );
            }
            let txn = Txn::new()
                .when(when)
                .and_then([
                    TxnOp::put(
                        full,
                        Self::value(request),
                        Some(PutOptions::new().with_lease(lease.id)),
                    ),
                    TxnOp::get(prefix.clone(), Some(self.contenders_range())),
                ])
                .or_else([TxnOp::get(prefix, Some(self.contenders_range()))]);
            let sent = failover(self.timeout(), || {
                let (mut c, t) = (self.etcd.client.clone(), txn.clone());
                async move { c.txn(t).await }
            })
            .await;
            match sent {
                Ok(resp) => break resp,
                // A spare that ended on the server: a new lease, once.
                Err(e) if is_lease_not_found(&e) && !retried => {
                    retried = true;
                    lease = self.lease_for_new(ttl).await?;
                }
                Err(e) => {
                    // The put may have happened: a key nobody keeps alive
                    // would block the lock for a TTL, so end its lease.
                    self.revoke(lease.id).await;
                    return Err(map("acquire txn", e));
                }
            }
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        let kvs = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
                _ => None,
            })
            .unwrap_or_default();
        let kvs = self.own_contenders(&request.key, kvs);
        if !resp.succeeded() && free_only {
            self.spare(ttl, lease);
            return Ok(Entry::Busy(kvs));
        }
        if !resp.succeeded() || revision <= 0 {
            self.revoke(lease.id).await;
            return Err(bad_value("a new contender's key existed already"));
        }
        Ok(Entry::Queued(Waiter { lease, revision }, kvs))
    }

    /// A new lease of `ttl` seconds, dropping the spares of that TTL (one
    /// of them ended on the server: the others are as old).
    async fn lease_for_new(&self, ttl: i64) -> Result<SharedLease> {
        lock(&self.spares).remove(&ttl);
        self.grant(ttl).await
    }

    /// Deletes a contender's key `full` (created at `revision`) and keeps
    /// its lease as a spare; if the delete fails, ends the lease instead.
    async fn withdraw(&self, full: &str, revision: i64, ttl: i64, lease: SharedLease) {
        match self
            .etcd
            .delete_grant(full, FencingToken(u64::try_from(revision).unwrap_or(0)))
            .await
        {
            Ok(_) => self.spare(ttl, lease),
            Err(_) => self.revoke(lease.id).await,
        }
    }

    /// Keeps `lease` alive: the lease as refreshed now, or `None` when it
    /// has ended.
    async fn keep_alive(&self, mut lease: SharedLease) -> Result<Option<SharedLease>> {
        let sent = Instant::now();
        Ok(self.etcd.keep_alive(lease.id).await?.map(|ttl| {
            lease.granted = ttl;
            lease.refreshed = sent;
            lease
        }))
    }

    /// Refreshes a waiter's key: keeps its lease alive, then reads the
    /// contenders. `None` when its lease or its key is gone.
    ///
    /// A waiter woken by its turn takes it from the nearby member's view
    /// alone, without a round trip to the leader, so that from a follower's
    /// site a hand-off costs only the release's way through the leader
    /// (docs/multi-dc.md). That view is trusted only when it shows the key
    /// at its place with no older contender, and the lease has half its
    /// TTL or more left on this side: revisions only grow, so an older
    /// contender gone at any revision after the waiter's is gone for good,
    /// and the waiter's key lasts as long as its lease, which the leader
    /// ends no earlier than this side counts. Any other view may only be
    /// behind, and is read again through the leader, keeping the lease
    /// alive first, as before.
    async fn refresh(
        &self,
        key: &LockKey,
        waiter: Waiter,
    ) -> Result<Option<(Waiter, Vec<KeyValue>)>> {
        let full = self.contender_key(key, waiter.lease.id);
        let mine =
            |kv: &KeyValue| kv.key() == full.as_bytes() && kv.create_revision() == waiter.revision;
        if waiter.lease.left() * 2 >= secs(waiter.lease.granted) {
            let kvs = self.contenders_nearby(key).await?;
            if kvs.first().is_some_and(mine) {
                return Ok(Some((waiter, kvs)));
            }
        }
        let Some(lease) = self.keep_alive(waiter.lease).await? else {
            return Ok(None);
        };
        let kvs = self.contenders(key).await?;
        Ok(kvs
            .iter()
            .any(mine)
            .then_some((Waiter { lease, ..waiter }, kvs)))
    }

    fn take_waiter(&self, key: &LockKey, owner: &Owner) -> Option<Waiter> {
        let mut waiters = lock(&self.waiters);
        let slot = (key.clone(), owner.clone());
        let waiter = waiters.get_mut(&slot)?.pop();
        if waiters.get(&slot).is_some_and(Vec::is_empty) {
            waiters.remove(&slot);
        }
        waiter
    }

    fn put_waiter(&self, key: &LockKey, owner: &Owner, waiter: Waiter) {
        lock(&self.waiters)
            .entry((key.clone(), owner.clone()))
            .or_default()
            .push(waiter);
    }

    /// `grant` as this backend remembers it, else as found among the
    /// contenders (owner checked; `asked` 0, as its TTL is not known).
    /// `None` when it is not held.
    async fn held(&self, grant: &LeaseId) -> Result<Option<Held>> {
        if let Some(held) = lock(&self.grants).get(grant).cloned() {
            return Ok(Some(held));
        }
        self.found(grant).await
    }

    /// `grant` as found among the contenders (see [`Self::held`]).
    async fn found(&self, grant: &LeaseId) -> Result<Option<Held>> {
        let kvs = self.contenders(&grant.key).await?;
        Ok(kvs
            .iter()
            .find(|kv| {
                token_of(kv) == grant.token
                    && decode(kv).is_ok_and(|stored| stored.owner == grant.owner)
            })
            .map(|kv| Held {
                full: String::from_utf8_lossy(kv.key()).into_owned(),
                lease: SharedLease {
                    id: kv.lease(),
                    granted: 0,
                    refreshed: Instant::now(),
                },
                asked: 0,
                expires_at: Utc::now(),
            }))
    }

    /// Whether the grant's key still has its create revision on `lease`.
    async fn carries(&self, full: &str, token: FencingToken, lease: i64) -> Result<bool> {
        let txn = Txn::new().when([
            Compare::create_revision(full, CompareOp::Equal, revision(token)),
            Compare::lease(full, CompareOp::Equal, lease),
        ]);
        Ok(self.etcd.txn("renewal check txn", txn).await?.succeeded())
    }

    /// Moves the grant `held` to a new lease of `ttl` seconds (an etcd
    /// lease's TTL cannot change): the key keeps its name and create
    /// revision, hence its token and its place, and the old lease, which
    /// carried this key alone, is revoked. The new lease, or `None` when
    /// the key is no longer the grant's.
    async fn move_to(&self, grant: &LeaseId, held: &Held, ttl: i64) -> Result<Option<SharedLease>> {
        let kvs = self.contenders(&grant.key).await?;
        let Some(kv) = kvs.iter().find(|kv| {
            kv.key() == held.full.as_bytes()
                && token_of(kv) == grant.token
                && kv.lease() == held.lease.id
        }) else {
            return Ok(None);
        };
        // A lease of its own, all of whose TTL the renewal reports.
        let target = self.grant(ttl).await?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(
                    held.full.clone(),
                    CompareOp::Equal,
                    revision(grant.token),
                ),
                Compare::mod_revision(held.full.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then([TxnOp::put(
                held.full.clone(),
                kv.value().to_vec(),
                Some(PutOptions::new().with_lease(target.id)),
            )]);
        let moved = match self.etcd.txn("lease move txn", txn).await {
            Ok(resp) => resp.succeeded(),
            Err(e) => {
                self.revoke(target.id).await;
                return Err(e);
            }
        };
        if moved {
            self.revoke(held.lease.id).await;
            Ok(Some(target))
        } else {
            self.revoke(target.id).await;
            Ok(None)
        }
    }

    /// Every contender in the namespace starting with `prefix`, grouped by
    /// lock, oldest first.
    async fn scan(&self, prefix: Option<&str>) -> Result<BTreeMap<LockKey, Vec<KeyValue>>> {
        let namespace = self.etcd.options.namespace.clone();
        let start = format!("{namespace}{}", prefix.unwrap_or(""));
        let options = if start.is_empty() {
            GetOptions::new().with_all_keys()
        } else {
            GetOptions::new().with_prefix()
        }
        .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut resp = failover(self.timeout(), || {
            let (mut c, k, o) = (self.etcd.client.clone(), start.clone(), options.clone());
            async move { c.get(k, Some(o)).await }
        })
        .await
        .map_err(|e| map("range", e))?;
        let mut locks: BTreeMap<LockKey, Vec<KeyValue>> = BTreeMap::new();
        for kv in resp.take_kvs() {
            // Contenders are on leases; fence records and other data are not.
            if kv.lease() == 0 {
                continue;
            }
            let Some(name) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(&namespace))
                .and_then(|k| k.rsplit_once('/'))
                .filter(|(_, id)| !id.is_empty())
                .and_then(|(name, _)| LockKey::new(name).ok())
            else {
                continue;
            };
            locks.entry(name).or_default().push(kv);
        }
        Ok(locks)
    }

    /// The holder of each lock in `scan`, with its acquisition time.
    async fn holders(&self, prefix: Option<&str>) -> Result<Vec<(LockInfo, i64)>> {
        let locks = self.scan(prefix).await?;
        let lookups = locks.iter().map(|(key, kvs)| async move {
            for kv in kvs {
                if let Some(found) = self.info(key, kv).await? {
                    return Result::<_>::Ok(Some(found));
                }
            }
            Ok(None)
        });
        let mut found = Vec::new();
        for r in futures_util::future::join_all(lookups).await {
            found.extend(r?);
        }
        Ok(found)
    }
}

/// A token as the create revision it is.
fn revision(token: FencingToken) -> i64 {
    i64::try_from(token.0).unwrap_or(i64::MAX)
}

#[async_trait]
impl Backend for EtcdLayoutBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_wakeups(true)
            .with_persistent(true)
            .with_set_data(true)
            .with_fair(true)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        request.exclusive_only(Backend::name(self))?;
        if request.min_token.is_some() {
            return Err(Error::unsupported(NAME, "min_token"));
        }
        let start = Instant::now();
        let (key, owner) = (&request.key, &request.owner);
        let ttl = ttl_secs(request.ttl);
        // A waiting acquisition goes on with the key it queued with; taken
        // out of the map meanwhile, so that two tasks of one owner never
        // both claim it.
        let queued = if request.queue {
            self.take_waiter(key, owner)
        } else {
            None
        };
        let refreshed = match queued {
            Some(waiter) => match self.refresh(key, waiter).await {
                Ok(Some(found)) => Some(found),
                Ok(None) => {
                    // Its lease ended (or its key was deleted): queue again.
                    self.revoke(waiter.lease.id).await;
                    None
                }
                Err(e) => {
                    self.put_waiter(key, owner, waiter);
                    return Err(e);
                }
            },
            None if !request.queue => match self.enter(request, true).await? {
                Entry::Queued(waiter, kvs) => Some((waiter, kvs)),
                Entry::Busy(kvs) if !kvs.is_empty() => {
                    return Ok(Acquire::Held(self.holder(key, &kvs).await?));
                }
                // Only locks named `NAME/…` have contenders: this lock's
                // own holder is judged by queueing.
                Entry::Busy(_) => None,
            },
            None => None,
        };
        let (waiter, kvs) = match refreshed {
            Some(found) => found,
            None => match self.enter(request, false).await? {
                Entry::Queued(waiter, kvs) => (waiter, kvs),
                Entry::Busy(_) => return Err(bad_value("a contender's key could not be put")),
            },
        };
        let full = self.contender_key(key, waiter.lease.id);
        if kvs.first().map(KeyValue::create_revision) == Some(waiter.revision) {
            let token = request.issued(u64::try_from(waiter.revision).unwrap_or(0))?;
            // All of a lease granted or kept alive by this call (the core's
            // send instant precedes it), else what is left of a spare.
            let granted = if waiter.lease.refreshed >= start {
                secs(waiter.lease.granted)
            } else {
                waiter.lease.left()
            };
            let expires_at = wall_in(granted);
            let held = Held {
                full,
                lease: waiter.lease,
                asked: ttl,
                expires_at,
            };
            lock(&self.grants).insert(request.lease(token), held);
            return Ok(Acquire::Granted(Grant::new(token, granted, expires_at)));
        }
        if request.queue {
            self.put_waiter(key, owner, waiter);
        } else {
            // A single try leaves nothing behind (`concurrency.TryLock`
            // deletes its key the same way).
            self.withdraw(&full, waiter.revision, ttl, waiter.lease)
                .await;
        }
        let older: Vec<KeyValue> = kvs
            .into_iter()
            .filter(|kv| kv.create_revision() < waiter.revision)
            .collect();
        Ok(Acquire::Held(self.holder(key, &older).await?))
    }

    async fn renew(&self, grant: &LeaseId, ttl: Duration) -> Result<Grant> {
        grant.exclusive_only(Backend::name(self))?;
        // A grant's lease is its own: keeping it alive keeps no other grant
        // alive. The check comes after the keep-alive for the reason given
        // in `EtcdBackend::renew_kept`.
        let asked = ttl_secs(ttl);
        let Some(held) = self.held(grant).await? else {
            return Err(Error::not_held(grant));
        };
        let lease = if held.asked == asked {
            match self.keep_alive(held.lease).await? {
                Some(lease) if self.carries(&held.full, grant.token, lease.id).await? => {
                    Some(lease)
                }
                _ => None,
            }
        } else {
            // Another TTL, or a grant made elsewhere.
            self.move_to(grant, &held, asked).await?
        };
        let lease = match lease {
            // Off the lease remembered here: gone, or moved by another
            // process renewing it; a grant that is still there moves here.
            None if held.asked != 0 => match self.found(grant).await? {
                Some(found) => self.move_to(grant, &found, asked).await?,
                None => None,
            },
            lease => lease,
        };
        let Some(lease) = lease else {
            lock(&self.grants).remove(grant);
            return Err(Error::not_held(grant));
        };
        // Kept alive or granted by this call: the whole TTL, counted from the
        // core's send instant, which precedes it.
        let granted = secs(lease.granted);
        let expires_at = wall_in(granted);
        lock(&self.grants).insert(
            grant.clone(),
            Held {
                lease,
                asked,
                expires_at,
                ..held
            },
        );
        Ok(Grant::new(grant.token, granted, expires_at))
    }

    async fn release(&self, grant: &LeaseId) -> Result<()> {
        grant.exclusive_only(Backend::name(self))?;
        let remembered = lock(&self.grants).remove(grant);
        let held = match remembered {
            Some(held) => Some(held),
            None => self.held(grant).await?,
        };
        let Some(held) = held else {
            return Err(Error::not_held(grant));
        };
        let deleted = self.etcd.delete_grant(&held.full, grant.token).await?;
        if deleted && held.asked > 0 {
            // The lease carried this key alone; the next contender of its
            // TTL may use it.
            self.spare(held.asked, held.lease);
        } else if deleted {
            self.revoke(held.lease.id).await;
        }
        grant.found(deleted)
    }

    async fn set_data(&self, grant: &LeaseId, data: Option<Value>) -> Result<()> {
        let Some(held) = self.held(grant).await? else {
            return Err(Error::not_held(grant));
        };
        let kvs = self.contenders(&grant.key).await?;
        let Some(kv) = kvs.iter().find(|kv| kv.key() == held.full.as_bytes()) else {
            return Err(Error::not_held(grant));
        };
        let mut value: Value = serde_json::from_slice(kv.value())
            .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
        value["data"] = data.unwrap_or(Value::Null);
        let full = held.full.clone();
        let txn = Txn::new()
            .when([
                Compare::create_revision(full.clone(), CompareOp::Equal, revision(grant.token)),
                Compare::mod_revision(full.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then([TxnOp::put(
                full,
                value.to_string(),
                Some(PutOptions::new().with_lease(kv.lease())),
            )]);
        if self.etcd.txn("set_data txn", txn).await?.succeeded() {
            Ok(())
        } else {
            Err(Error::not_held(grant))
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let kvs = self.contenders(key).await?;
        self.holder(key, &kvs).await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        // Every deletion among the contenders: `concurrency` waiters watch
        // only their predecessor, but a fencelock waiter's attempt reads
        // the whole queue anyway.
        let options = WatchOptions::new()
            .with_filters([WatchFilterType::NoPut])
            .with_prefix();
        let stream = self
            .etcd
            .open_watch_at(self.contenders_prefix(key), options)
            .await?;
        // Complete: the watch delivers every deletion in order while it
        // lives (expiries too: etcd deletes an expired lease's keys), and a
        // woken waiter's turn costs no write, so trying between wake-ups
        // would only delay the answer to one. (The default layout's waiters
        // do try: their grant is a write, and one sent while the release
        // is on its way can land just after it.)
        Ok(Some(delete_wakeups(stream).complete()))
    }

    fencelock_core::offers!(admin, fair_queue);
}
