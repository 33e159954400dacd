//! [`EtcdLayoutBackend`]: locks laid out as etcd's own `concurrency`
//! package lays them out (`layout=etcd`, `docs/etcd.md`).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Error, FencingToken,
    Grant, LeaseId, LockInfo, LockKey, LockMode, Owner, Result, Stats, WakeSubscription,
    ELECTION_PREFIX,
};
use serde_json::{json, Value};

use crate::{
    backend::{decode, delete_wakeups, secs, token_of, ttl_secs, wall_in, EtcdBackend},
    error::{bad_value, failover, map, NAME},
    options::EtcdOptions,
};

/// A waiting acquisition's key (`NAME/<lease>`): its lease and its create
/// revision, which is its place in the queue and, once it is the oldest,
/// its token.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    lease: i64,
    revision: i64,
}

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
    /// The etcd lease of each grant this backend made, so renew and release
    /// need no read first.
    grants: Arc<Mutex<HashMap<LeaseId, i64>>>,
    /// The keys this backend's waiting acquisitions keep in the queue, by
    /// lock and owner (tasks of one owner may wait on one lock at once).
    waiters: Arc<Mutex<HashMap<(LockKey, Owner), Vec<Waiter>>>>,
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
            waiters: Arc::default(),
        })
    }

    /// Connects to `url` (see [`EtcdOptions::from_url`]); `layout=etcd` may
    /// be left out.
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
        let (prefix, options) = (self.contenders_prefix(key), self.contenders_range());
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
        let info = LockInfo {
            key: key.clone(),
            owner,
            token: token_of(kv),
            kind,
            data,
            acquired_at: DateTime::from_timestamp_millis(acquired_ms).unwrap_or_default(),
            expires_at: wall_in(left),
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

    /// Joins the queue of `request.key`: a new lease of the request's TTL,
    /// and the key `NAME/<lease>` on it, written in the Txn that reads the
    /// contenders (as `concurrency.Mutex` does). Returns the waiter, the
    /// TTL granted, and the contenders oldest first.
    async fn enter(&self, request: &AcquireRequest) -> Result<(Waiter, i64, Vec<KeyValue>)> {
        let ttl = ttl_secs(request.ttl);
        let granted = failover(self.timeout(), || {
            let mut c = self.etcd.client.clone();
            async move { c.lease_grant(ttl, None).await }
        })
        .await
        .map_err(|e| map("lease grant", e))?;
        let lease = granted.id();
        let full = self.contender_key(&request.key, lease);
        let txn = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    full,
                    Self::value(request),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(
                    self.contenders_prefix(&request.key),
                    Some(self.contenders_range()),
                ),
            ]);
        let resp = match self.etcd.txn("acquire txn", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // The put may have happened: a key nobody keeps alive would
                // block the lock for a TTL, so end its lease.
                self.revoke(lease).await;
                return Err(e);
            }
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() || revision <= 0 {
            self.revoke(lease).await;
            return Err(bad_value("a new lease's key existed already"));
        }
        let kvs = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
                _ => None,
            })
            .unwrap_or_default();
        let waiter = Waiter { lease, revision };
        Ok((waiter, granted.ttl(), self.own_contenders(&request.key, kvs)))
    }

    /// Refreshes a waiter's key: keeps its lease alive, then reads the
    /// contenders. `None` when its lease or its key is gone.
    async fn refresh(
        &self,
        key: &LockKey,
        waiter: Waiter,
    ) -> Result<Option<(i64, Vec<KeyValue>)>> {
        let Some(ttl) = self.etcd.keep_alive(waiter.lease).await? else {
            return Ok(None);
        };
        let kvs = self.contenders(key).await?;
        let full = self.contender_key(key, waiter.lease);
        let present = kvs
            .iter()
            .any(|kv| kv.key() == full.as_bytes() && kv.create_revision() == waiter.revision);
        Ok(present.then_some((ttl, kvs)))
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

    /// The etcd lease of `grant`: remembered if granted here, else found
    /// among the contenders (owner checked). `None` when it is not held.
    async fn lease_of(&self, grant: &LeaseId) -> Result<Option<i64>> {
        if let Some(lease) = lock(&self.grants).get(grant).copied() {
            return Ok(Some(lease));
        }
        let kvs = self.contenders(&grant.key).await?;
        Ok(kvs
            .iter()
            .find(|kv| {
                token_of(kv) == grant.token
                    && decode(kv).is_ok_and(|stored| stored.owner == grant.owner)
            })
            .map(KeyValue::lease))
    }

    /// Whether the grant's key still has its create revision on `lease`.
    async fn carries(&self, grant: &LeaseId, lease: i64) -> Result<bool> {
        let full = self.contender_key(&grant.key, lease);
        let txn = Txn::new().when([
            Compare::create_revision(full.clone(), CompareOp::Equal, revision(grant.token)),
            Compare::lease(full, CompareOp::Equal, lease),
        ]);
        Ok(self.etcd.txn("renewal check txn", txn).await?.succeeded())
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
        if request.min_token.is_some() {
            return Err(Error::unsupported(NAME, "min_token"));
        }
        let (key, owner) = (&request.key, &request.owner);
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
                Ok(Some((ttl, kvs))) => Some((waiter, ttl, kvs)),
                Ok(None) => {
                    // Its lease ended (or its key was deleted): queue again.
                    self.revoke(waiter.lease).await;
                    None
                }
                Err(e) => {
                    self.put_waiter(key, owner, waiter);
                    return Err(e);
                }
            },
            None => None,
        };
        let (waiter, ttl, kvs) = match refreshed {
            Some(found) => found,
            None => self.enter(request).await?,
        };
        let oldest = kvs.first().map(KeyValue::create_revision);
        if oldest == Some(waiter.revision) {
            let token = request.issued(u64::try_from(waiter.revision).unwrap_or(0))?;
            lock(&self.grants).insert(request.lease(token), waiter.lease);
            let granted = secs(ttl);
            return Ok(Acquire::Granted(Grant::new(token, granted, wall_in(granted))));
        }
        if request.queue {
            self.put_waiter(key, owner, waiter);
        } else {
            // A single try leaves nothing behind (`concurrency.TryLock`
            // deletes its key the same way).
            self.revoke(waiter.lease).await;
        }
        let older: Vec<KeyValue> = kvs
            .into_iter()
            .filter(|kv| kv.create_revision() < waiter.revision)
            .collect();
        Ok(Acquire::Held(self.holder(key, &older).await?))
    }

    async fn renew(&self, grant: &LeaseId, _ttl: Duration) -> Result<Grant> {
        // The grant's lease is its own: keeping it alive keeps no other
        // grant alive. Its TTL cannot change; the keep-alive answers the
        // TTL it was extended by. The check comes after the keep-alive for
        // the reason given in `EtcdBackend::renew_kept`.
        let Some(lease) = self.lease_of(grant).await? else {
            return Err(Error::not_held(grant));
        };
        let kept = match self.etcd.keep_alive(lease).await? {
            Some(ttl) if self.carries(grant, lease).await? => ttl,
            _ => {
                lock(&self.grants).remove(grant);
                return Err(Error::not_held(grant));
            }
        };
        lock(&self.grants).insert(grant.clone(), lease);
        let granted = secs(kept);
        Ok(Grant::new(grant.token, granted, wall_in(granted)))
    }

    async fn release(&self, grant: &LeaseId) -> Result<()> {
        let remembered = lock(&self.grants).remove(grant);
        let lease = match remembered {
            Some(lease) => Some(lease),
            None => self.lease_of(grant).await?,
        };
        let Some(lease) = lease else {
            return Err(Error::not_held(grant));
        };
        let full = self.contender_key(&grant.key, lease);
        let deleted = self.etcd.delete_grant(&full, grant.token).await?;
        if deleted {
            // The lease was this grant's alone.
            self.revoke(lease).await;
        }
        grant.found(deleted)
    }

    async fn set_data(&self, grant: &LeaseId, data: Option<Value>) -> Result<()> {
        let Some(lease) = self.lease_of(grant).await? else {
            return Err(Error::not_held(grant));
        };
        let full = self.contender_key(&grant.key, lease);
        let kvs = self.contenders(&grant.key).await?;
        let Some(kv) = kvs.iter().find(|kv| kv.key() == full.as_bytes()) else {
            return Err(Error::not_held(grant));
        };
        let mut value: Value = serde_json::from_slice(kv.value())
            .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
        value["data"] = data.unwrap_or(Value::Null);
        let txn = Txn::new()
            .when([
                Compare::create_revision(full.clone(), CompareOp::Equal, revision(grant.token)),
                Compare::mod_revision(full.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then([TxnOp::put(
                full,
                value.to_string(),
                Some(PutOptions::new().with_lease(lease)),
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

    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        Ok(self
            .holders(prefix)
            .await?
            .into_iter()
            .map(|(i, _)| i)
            .collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let kvs = self.contenders(key).await?;
        let Some(kv) = kvs.first() else {
            return Ok(None);
        };
        if decode(kv).is_err() {
            // A `concurrency` holder never reads its key again: deleting it
            // would leave that holder working beside the next one.
            return Err(Error::Unsupported(format!(
                "etcd backend: {key} is held by a client of etcd's concurrency package \
                 (lease {}), which would not notice a force-release; end it there, or \
                 revoke its lease (etcdctl lease revoke {})",
                hex(kv.lease()),
                hex(kv.lease()),
            )));
        }
        let info = self.info(key, kv).await?;
        let full = String::from_utf8_lossy(kv.key()).into_owned();
        if info.is_some() && self.etcd.delete_grant(&full, token_of(kv)).await? {
            return Ok(info.map(|(i, _)| i));
        }
        Ok(None)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let mut released = 0;
        for (key, kvs) in self.scan(None).await? {
            for kv in kvs {
                if !decode(&kv).is_ok_and(|stored| stored.owner == *owner) {
                    continue;
                }
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                if self.etcd.delete_grant(&full, token_of(&kv)).await? {
                    lock(&self.grants).remove(&LeaseId::new(
                        key.clone(),
                        owner.clone(),
                        token_of(&kv),
                    ));
                    self.revoke(kv.lease()).await;
                    released += 1;
                }
            }
        }
        Ok(released)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        // etcd deletes a key when its lease expires.
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats> {
        let holders = self.holders(None).await?;
        let now = Utc::now().timestamp_millis();
        let held = |acq: i64| Duration::from_millis(u64::try_from(now - acq).unwrap_or(0));
        Ok(Stats::from_leases(
            holders.iter().map(|(i, acq)| (i, held(*acq))),
            0,
        ))
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
        Ok(Some(delete_wakeups(stream)))
    }

    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        if let Some(waiter) = self.take_waiter(key, owner) {
            self.revoke(waiter.lease).await;
        }
        Ok(())
    }

    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>> {
        let kvs = self.contenders(key).await?;
        let mut entries = Vec::new();
        for kv in kvs.iter().skip(1) {
            if let Some((info, _)) = self.info(key, kv).await? {
                entries.push(info);
            }
        }
        Ok(entries)
    }
}
