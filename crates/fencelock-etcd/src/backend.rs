//! [`EtcdBackend`]: the `Backend` implementation.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendError, Capabilities, Error, FencingToken, Grant,
    LeaseId, LockInfo, LockKey, Owner, Result, Stats, WakeSubscription,
};
use serde_json::{json, Value};

use crate::{
    error::{bad_value, bounded, failover, is_lease_not_found, map, NAME},
    options::EtcdOptions,
};

/// Lease ids of grants this backend made, so renew and release need no read
/// first. Bounded: when full it is cleared, and calls fall back to reading
/// the key (correct, one round trip more).
const LEASE_CACHE_LIMIT: usize = 4096;

type CacheKey = (LockKey, Owner, FencingToken);

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

/// Locks in etcd. Cheap to clone; clones share the gRPC channel.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Client,
    options: Arc<EtcdOptions>,
    leases: Arc<Mutex<HashMap<CacheKey, Cached>>>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Builds a client for `options` (shared with the fence).
pub(crate) async fn connect(options: &EtcdOptions) -> Result<Client> {
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
    let client = bounded(timeout, Client::connect(&options.endpoints, Some(connect)))
        .await
        .map_err(|e| map("connect", e))?;
    let answered = failover(timeout, || {
        let mut c = client.clone();
        async move { c.status().await }
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
    Ok(client)
}

/// Whole seconds, rounded up: etcd leases have a one-second resolution and
/// must never be shorter than asked.
fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A token as the create revision it is.
fn revision(token: FencingToken) -> i64 {
    i64::try_from(token.0).unwrap_or(i64::MAX)
}

fn secs(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

fn wall_in(d: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(d).unwrap_or_default()
}

/// What is stored under a lock key. `acquired_ms` is the granting client's
/// wall clock, for display and hold-time statistics only; expiry is etcd's
/// lease.
struct Stored {
    owner: Owner,
    kind: Option<String>,
    data: Option<Value>,
    acquired_ms: i64,
}

fn decode(kv: &KeyValue) -> Result<Stored> {
    let v: Value = serde_json::from_slice(kv.value())
        .map_err(|e| bad_value(format!("lock value is not JSON: {e}")))?;
    let owner = v
        .get("owner")
        .and_then(Value::as_str)
        .and_then(|o| Owner::new(o).ok())
        .ok_or_else(|| bad_value("lock value has no valid owner"))?;
    Ok(Stored {
        owner,
        kind: v.get("kind").and_then(Value::as_str).map(str::to_owned),
        data: v.get("data").filter(|d| !d.is_null()).cloned(),
        acquired_ms: v.get("acquired_ms").and_then(Value::as_i64).unwrap_or(0),
    })
}

fn token_of(kv: &KeyValue) -> FencingToken {
    FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0))
}

impl EtcdBackend {
    /// Connects with `options`.
    pub async fn connect_with(options: EtcdOptions) -> Result<Self> {
        let client = connect(&options).await?;
        Ok(Self {
            client,
            options: Arc::new(options),
            leases: Arc::default(),
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

    fn locks_prefix(&self) -> String {
        format!("{}/locks/", self.options.prefix)
    }

    fn key(&self, key: &LockKey) -> String {
        format!("{}{}", self.locks_prefix(), key.as_str())
    }

    fn user_key(&self, kv: &KeyValue) -> Option<LockKey> {
        let raw = std::str::from_utf8(kv.key()).ok()?;
        LockKey::new(raw.strip_prefix(&self.locks_prefix())?).ok()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Cached>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, k: CacheKey, lease: i64, asked: i64, expires_at: DateTime<Utc>) {
        let mut cache = self.cache();
        if cache.len() >= LEASE_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(
            k,
            Cached {
                lease,
                asked,
                expires_at,
            },
        );
    }

    /// What this backend remembers of a grant it made or renewed.
    fn cached(&self, k: &CacheKey) -> Option<Cached> {
        self.cache().get(k).copied()
    }

    /// The lease the key carries now if it is (owner, token)'s grant, by
    /// reading the key; `None` when the key is gone or is another grant.
    async fn current_lease(
        &self,
        key: &LockKey,
        owner: &Owner,
        token: FencingToken,
    ) -> Result<Option<i64>> {
        let Some(kv) = self.get(key).await? else {
            return Ok(None);
        };
        let stored = decode(&kv)?;
        Ok((token_of(&kv) == token && stored.owner == *owner).then_some(kv.lease()))
    }

    async fn get(&self, key: &LockKey) -> Result<Option<KeyValue>> {
        let full = self.key(key);
        let mut resp = failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), full.clone());
            async move { c.get(k, None).await }
        })
        .await
        .map_err(|e| map("get", e))?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// One keep-alive round trip: the lease's TTL in seconds (to which it
    /// was just extended), `None` when the lease is gone.
    async fn keep_alive(&self, lease: i64) -> Result<Option<i64>> {
        let kept = bounded(self.options.timeout, async {
            let (mut keeper, mut stream) = failover(self.options.timeout, || {
                let mut c = self.client.clone();
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
        })
        .await;
        match kept {
            Ok(ttl) if ttl > 0 => Ok(Some(ttl)),
            Ok(_) => Ok(None),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(map("lease keep-alive", e)),
        }
    }

    /// A new lease of `ttl` seconds: (id, the TTL etcd granted, which may be
    /// longer).
    async fn grant_lease(&self, ttl: i64) -> Result<(i64, i64)> {
        let lease = failover(self.options.timeout, || {
            let mut c = self.client.clone();
            async move { c.lease_grant(ttl, None).await }
        })
        .await
        .map_err(|e| map("lease grant", e))?;
        Ok((lease.id(), lease.ttl()))
    }

    /// Runs `txn`, which attaches a key to the fresh lease `lease`. If the
    /// call fails, the lease is revoked: whether or not the put happened,
    /// it must not outlive this failed call holding the key.
    async fn txn_with_fresh_lease(&self, what: &str, txn: Txn, lease: i64) -> Result<TxnResponse> {
        match failover(self.options.timeout, || {
            let (mut c, t) = (self.client.clone(), txn.clone());
            async move { c.txn(t).await }
        })
        .await
        {
            Ok(resp) => Ok(resp),
            Err(e) => {
                let _ = self.revoke(lease).await;
                // The fresh lease ran out before the Txn reached the leader
                // (a slow leader, retries against a dead endpoint): nothing
                // was written, and the next attempt gets a new lease.
                if is_lease_not_found(&e) {
                    return Err(BackendError::transient(
                        NAME,
                        format!("the new lease expired before the {what}"),
                        e,
                    )
                    .into());
                }
                Err(map(what, e))
            }
        }
    }

    /// Whether `full` is still the key created at revision `token` and
    /// attached to `lease`: the grant is alive exactly as long as that lease.
    async fn carries(&self, full: &str, token: FencingToken, lease: i64) -> Result<bool> {
        let txn = Txn::new().when([
            Compare::create_revision(full, CompareOp::Equal, revision(token)),
            Compare::lease(full, CompareOp::Equal, lease),
        ]);
        let resp = failover(self.options.timeout, || {
            let (mut c, t) = (self.client.clone(), txn.clone());
            async move { c.txn(t).await }
        })
        .await
        .map_err(|e| map("renewal check txn", e))?;
        Ok(resp.succeeded())
    }

    /// Moves the grant (`full` created at revision `token`, on lease `old`)
    /// to a new lease of `ttl` seconds: the key keeps its value and its
    /// create revision, hence its token. `Some((lease, granted ttl))` once
    /// moved, or, when etcd rounds `ttl` up to `current` (the old lease's
    /// TTL), the old lease unchanged; `None` when the key no longer carries
    /// the grant.
    async fn move_to_new_lease(
        &self,
        full: &str,
        token: FencingToken,
        old: i64,
        ttl: i64,
        current: i64,
    ) -> Result<Option<(i64, i64)>> {
        let (new, granted) = self.grant_lease(ttl).await?;
        if granted == current {
            let _ = self.revoke(new).await;
            return Ok(self
                .carries(full, token, old)
                .await?
                .then_some((old, current)));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(full, CompareOp::Equal, revision(token)),
                Compare::lease(full, CompareOp::Equal, old),
            ])
            .and_then([TxnOp::put(
                full,
                "",
                Some(PutOptions::new().with_lease(new).with_ignore_value()),
            )]);
        let resp = self
            .txn_with_fresh_lease("lease move txn", txn, new)
            .await?;
        if !resp.succeeded() {
            let _ = self.revoke(new).await;
            return Ok(None);
        }
        // The key left the old lease, so revoking it deletes nothing; it
        // would otherwise linger until its TTL ran out.
        if let Err(e) = self.revoke(old).await {
            tracing::debug!(error = %e, "revoking a replaced etcd lease failed; it will expire");
        }
        Ok(Some((new, granted)))
    }

    /// Renews the grant on `lease` for `ttl` seconds: `Some((lease, ttl))`
    /// of the renewed grant, `None` when `lease` no longer carries it.
    /// `asked` is the TTL asked for when `lease` was granted, if known: a
    /// lease that etcd rounded up from `ttl` already is the lease `ttl`
    /// gets, and moving it would only cost a grant and a revoke.
    ///
    /// The keep-alive comes first and the check that the key still carries
    /// this grant on this lease second: a live lease alone proves nothing
    /// (deleting the key leaves its lease alive), and a check before the
    /// keep-alive would leave the key's removal in between unnoticed. The
    /// core's send instant precedes both requests, so the guard's deadline
    /// (I5) counts from before the keep-alive.
    async fn renew_lease(
        &self,
        full: &str,
        token: FencingToken,
        lease: i64,
        ttl: i64,
        asked: Option<i64>,
    ) -> Result<Option<(i64, i64)>> {
        let Some(current) = self.keep_alive(lease).await? else {
            return Ok(None);
        };
        if ttl != current && asked != Some(ttl) {
            return self
                .move_to_new_lease(full, token, lease, ttl, current)
                .await;
        }
        Ok(self
            .carries(full, token, lease)
            .await?
            .then_some((lease, current)))
    }

    /// Revokes `lease`, which deletes the key attached to it. `false` when
    /// the lease had already ended.
    async fn revoke(&self, lease: i64) -> Result<bool> {
        let revoked = failover(self.options.timeout, || {
            let mut c = self.client.clone();
            async move { c.lease_revoke(lease).await }
        })
        .await;
        match revoked {
            Ok(_) => Ok(true),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(map("lease revoke", e)),
        }
    }

    /// The lease's remaining TTL; `None` when it has ended.
    async fn remaining(&self, lease: i64) -> Result<Option<Duration>> {
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
        let stored = decode(kv)?;
        let Some(left) = self.remaining(kv.lease()).await? else {
            return Ok(None);
        };
        // TimeToLive reports whole seconds, rounded down; a key that still
        // exists has not expired, so report at least a millisecond.
        let left = left.max(Duration::from_millis(1));
        let token = token_of(kv);
        let expires_at = self
            .cache()
            .get(&(key.clone(), stored.owner.clone(), token))
            .filter(|c| c.lease == kv.lease())
            .map_or_else(|| wall_in(left), |c| c.expires_at);
        let info = LockInfo {
            key,
            owner: stored.owner,
            token,
            kind: stored.kind,
            data: stored.data,
            acquired_at: DateTime::from_timestamp_millis(stored.acquired_ms).unwrap_or_default(),
            expires_at,
            expires_in: left,
        };
        Ok(Some((info, stored.acquired_ms)))
    }

    /// Every lock key starting with `start` (a literal prefix).
    async fn range(&self, start: String) -> Result<etcd_client::GetResponse> {
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
        let lookups = kvs.iter().filter_map(|kv| {
            let key = self.user_key(kv)?;
            Some(self.info(key, kv))
        });
        let mut found = Vec::new();
        for r in futures_util::future::join_all(lookups).await {
            if let Some(entry) = r? {
                found.push(entry);
            }
        }
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
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
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        // The lease is granted right before the put-if-absent, never before
        // waiting, so a waiter cannot win with a lease that ran out while it
        // waited; the caller's t_sent precedes both requests.
        let (lease, granted) = self.grant_lease(ttl_secs(request.ttl)).await?;
        let granted = secs(granted);
        let value = json!({
            "owner": request.owner.as_str(),
            "lease": lease,
            "kind": request.kind,
            "data": request.data,
            "acquired_ms": Utc::now().timestamp_millis(),
        });
        let key = self.key(&request.key);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .txn_with_fresh_lease("put-if-absent txn", txn, lease)
            .await?;
        if resp.succeeded() {
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            let token = FencingToken(u64::try_from(revision).unwrap_or(0));
            if token.0 == 0 {
                let _ = self.revoke(lease).await;
                return Err(bad_value("txn response without a revision"));
            }
            let expires_at = wall_in(granted);
            self.remember(
                (request.key.clone(), request.owner.clone(), token),
                lease,
                ttl_secs(request.ttl),
                expires_at,
            );
            return Ok(Acquire::Granted(Grant::new(token, granted, expires_at)));
        }
        let holder = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        // Our unused lease is revoked while we look up the holder's.
        let (revoked, info) = tokio::join!(self.revoke(lease), async {
            match &holder {
                Some(kv) => self.info(request.key.clone(), kv).await,
                None => Ok(None),
            }
        });
        if let Err(e) = revoked {
            tracing::debug!(error = %e, "revoking an unused etcd lease failed; it will expire");
        }
        Ok(Acquire::Held(info?.map(|(i, _)| i)))
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let cache_key = (key.clone(), owner.clone(), token);
        let full = self.key(key);
        let ttl = ttl_secs(ttl);
        let renewed = |(etcd_lease, granted): (i64, i64)| {
            let granted = secs(granted);
            let expires_at = wall_in(granted);
            self.remember(cache_key.clone(), etcd_lease, ttl, expires_at);
            Grant::new(token, granted, expires_at)
        };
        // The lease is this grant's alone (granted for it, or moved to by a
        // renewal with another TTL), so keeping it alive cannot extend a
        // successor, which has its own.
        let cached = self.cached(&cache_key);
        if let Some(c) = cached {
            let done = self
                .renew_lease(&full, token, c.lease, ttl, Some(c.asked))
                .await?;
            if let Some(done) = done {
                return Ok(renewed(done));
            }
            self.cache().remove(&cache_key);
        }
        // Nothing remembered (another process granted it), or the grant has
        // left the remembered lease: another process may have renewed it
        // with another TTL, which moves it to a new lease.
        match self.current_lease(key, owner, token).await? {
            Some(etcd_lease) if Some(etcd_lease) != cached.map(|c| c.lease) => {
                if let Some(done) = self
                    .renew_lease(&full, token, etcd_lease, ttl, None)
                    .await?
                {
                    return Ok(renewed(done));
                }
            }
            _ => {}
        }
        Err(Error::not_held(lease))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        // Revoking the grant's own lease deletes exactly this grant's key
        // (atomically, on the server) and nothing else; the DELETE event
        // wakes the watchers.
        let cache_key = (key.clone(), owner.clone(), token);
        let cached = self.cached(&cache_key).map(|c| c.lease);
        if let Some(etcd_lease) = cached {
            let revoked = self.revoke(etcd_lease).await?;
            self.cache().remove(&cache_key);
            if revoked {
                return Ok(());
            }
        }
        // As in renew: the grant may live on another lease than remembered.
        let revoked = match self.current_lease(key, owner, token).await? {
            Some(etcd_lease) if Some(etcd_lease) != cached => self.revoke(etcd_lease).await?,
            _ => false,
        };
        lease.found(revoked)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let Some(kv) = self.get(key).await? else {
            return Ok(None);
        };
        Ok(self.info(key.clone(), &kv).await?.map(|(i, _)| i))
    }

    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        Ok(self
            .scan(prefix)
            .await?
            .into_iter()
            .map(|(i, _)| i)
            .collect())
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let Some(kv) = self.get(key).await? else {
            return Ok(None);
        };
        let info = self.info(key.clone(), &kv).await?;
        // Revoke rather than delete: the holder's keep-alives then fail too,
        // so its guard notices the loss on its next renewal.
        if info.is_some() && self.revoke(kv.lease()).await? {
            return Ok(info.map(|(i, _)| i));
        }
        Ok(None)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let mut resp = self.range(self.locks_prefix()).await?;
        let mut released = 0;
        for kv in resp.take_kvs() {
            let Ok(stored) = decode(&kv) else { continue };
            // The lease is this key incarnation's own: revoking it cannot
            // touch a successor that took the key since the range read.
            if stored.owner == *owner && self.revoke(kv.lease()).await? {
                released += 1;
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

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        let full = self.key(key);
        let mut stream = failover(self.options.timeout, || {
            let (mut c, k) = (self.client.clone(), full.clone());
            let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            async move { c.watch(k, Some(options)).await }
        })
        .await
        .map_err(|e| map("watch", e))?;
        // Wait for the "created" answer so a release right after we return
        // is not missed.
        bounded(self.options.timeout, stream.message())
            .await
            .map_err(|e| map("watch", e))?
            .ok_or_else(|| bad_value("watch closed before it was created"))?;
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
        Ok(Some(WakeSubscription::from_stream(wakeups)))
    }
}
