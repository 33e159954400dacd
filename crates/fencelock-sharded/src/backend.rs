//! [`ShardedBackend`]: routing, the two-shard path of a moving key, and the
//! operations that fan out.

use std::{
    collections::BTreeMap,
    fmt,
    sync::Mutex,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use fencelock_core::{
    renew_part, Acquire, AcquireRequest, Backend, Capabilities, Error, Grant, LeaseId, LockInfo,
    LockKey, Owner, Renewal, Result, WakeSubscription,
};

use crate::{
    config::{self, Phase, Placement, ShardMap},
    epoch, Opener,
};

mod admin;

/// How often a process checks the epoch record of every store of its map,
/// not only of those its operations touch: so that a store only some other
/// store's keys would reach still shows this epoch (docs/sharding.md).
const CHECK_ALL_EVERY: Duration = Duration::from_secs(3600);

/// The lease that carries a token from the old shards to the new ones
/// (released at once; this is only how long a lost release leaves it).
const WATERMARK_TTL: Duration = Duration::from_secs(10);

/// A backend over the shards of a [`ShardMap`] (see docs/sharding.md).
pub struct ShardedBackend {
    epoch: u64,
    phase: Option<Phase>,
    /// One per distinct URL: a shard named in both lists, or two names for
    /// one store, is one backend.
    backends: Vec<std::sync::Arc<dyn Backend>>,
    /// (name, index into `backends`) of the current shards.
    current: Vec<(String, usize)>,
    /// The placement rules of the current shards.
    current_rules: Vec<Placement>,
    /// The same for the previous map during a transition.
    previous: Vec<(String, usize)>,
    /// The placement rules of the previous map.
    previous_rules: Vec<Placement>,
    /// The first shard name of each backend, for messages.
    names: Vec<String>,
    capabilities: Capabilities,
    /// When every store's epoch record was last checked.
    checked_all: Mutex<Option<Instant>>,
}

impl fmt::Debug for ShardedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |list: &[(String, usize)]| -> Vec<String> {
            list.iter().map(|(name, _)| name.clone()).collect()
        };
        f.debug_struct("ShardedBackend")
            .field("epoch", &self.epoch)
            .field("phase", &self.phase)
            .field("shards", &names(&self.current))
            .field("previous", &names(&self.previous))
            .finish_non_exhaustive()
    }
}

/// Where a key's operations go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Its owner (the same shard in both maps, or no transition).
    One(usize),
    /// A key that moves: `authority` issues the token and answers reads;
    /// `follower` is taken too, with the authority's token as floor.
    Two { authority: usize, follower: usize },
}

impl Route {
    /// The backend whose answer stands for the key.
    fn authority(self) -> usize {
        match self {
            Route::One(i) | Route::Two { authority: i, .. } => i,
        }
    }
}

impl ShardedBackend {
    /// Opens every distinct shard URL of `map` once, with `open`.
    ///
    /// A map in transition needs token floors (`Capabilities::min_token`)
    /// on every shard; without them it is `Unsupported`.
    pub async fn open(map: ShardMap, open: Opener) -> Result<Self> {
        let mut urls: Vec<String> = Vec::new();
        let mut backends = Vec::new();
        let mut index = |url: &str| match urls.iter().position(|u| u == url) {
            Some(i) => (i, None),
            None => {
                urls.push(url.to_owned());
                (urls.len() - 1, Some(url.to_owned()))
            }
        };
        let (phase, previous) = match map.transition {
            Some((phase, previous)) => (Some(phase), previous),
            None => (None, Vec::new()),
        };
        let mut current_idx = Vec::new();
        let mut previous_idx = Vec::new();
        let mut to_open = Vec::new();
        for (list, out) in [
            (&map.shards, &mut current_idx),
            (&previous, &mut previous_idx),
        ] {
            for shard in list {
                let (i, new) = index(&shard.url);
                to_open.extend(new.map(|url| (shard.name.clone(), url)));
                out.push((shard.name.clone(), i));
            }
        }
        let mut names = Vec::new();
        for (name, url) in to_open {
            // Which shard's URL is wrong; the driver's message has no
            // password.
            let backend = open(url).await.map_err(|e| match e {
                Error::InvalidUrl(msg) => Error::InvalidUrl(format!("shard {name:?}: {msg}")),
                other => other,
            })?;
            backends.push(backend);
            names.push(name);
        }
        let all = |f: fn(&Capabilities) -> bool| backends.iter().all(|b| f(&b.capabilities()));
        let any = |f: fn(&Capabilities) -> bool| backends.iter().any(|b| f(&b.capabilities()));
        if phase.is_some() && !all(|c| c.min_token) {
            return Err(Error::Unsupported(
                "a shard map in transition needs token floors (min_token) on every shard".into(),
            ));
        }
        // What every shard offers, minus what a key taken on two shards
        // cannot keep: read-write locks, watches and one-round-trip batches;
        // and bound to a session if any shard's leases are (a restriction,
        // not an offer).
        let capabilities = Capabilities::default()
            .with_wakeups(all(|c| c.wakeups))
            .with_persistent(all(|c| c.persistent))
            .with_keeps_expired(all(|c| c.keeps_expired))
            .with_min_token(all(|c| c.min_token))
            .with_set_data(all(|c| c.set_data))
            .with_session_bound(any(|c| c.session_bound));
        let backend = Self {
            epoch: map.epoch,
            phase,
            backends,
            current: current_idx,
            current_rules: map.placement,
            previous: previous_idx,
            previous_rules: map.previous_placement,
            names,
            capabilities,
            checked_all: Mutex::new(None),
        };
        // A process whose map is more than one step from what a store has
        // seen is refused before its first operation.
        backend.check_all(Duration::ZERO).await?;
        if phase == Some(Phase::Handover) {
            backend.carry_watermark().await?;
        }
        Ok(backend)
    }

    /// Raises the token counter of every current shard above every token
    /// the previous shards have issued, before this `handover` process
    /// grants anything (docs/sharding.md, "Why this keeps I2"): a key last
    /// taken on the old map and left alone during `join` is next granted
    /// by its new owner, which never saw its old tokens. The old map's
    /// processes are gone by now (this step starts only once every process
    /// runs `join`, and they are refused from here on), so the old shard's
    /// next token is above all of theirs; a grant with that as floor on the
    /// new shard lifts a counter that serves every key (one per store:
    /// memory, SQLite, PostgreSQL, MySQL). Each process uses a key of its
    /// own, so concurrent openers never meet.
    async fn carry_watermark(&self) -> Result<()> {
        let mut olds: Vec<usize> = self.previous.iter().map(|(_, i)| *i).collect();
        olds.sort_unstable();
        olds.dedup();
        let mut news: Vec<usize> = self.current.iter().map(|(_, i)| *i).collect();
        news.sort_unstable();
        news.dedup();
        let owner = Owner::generate();
        let key = LockKey::new(format!(
            "{}watermark:{}",
            epoch::RESERVED_PREFIX,
            owner.as_str()
        ))?;
        let draw = |i: usize, floor: Option<fencelock_core::FencingToken>| {
            let request = AcquireRequest::new(key.clone(), owner.clone(), WATERMARK_TTL)
                .with_min_token(floor);
            async move {
                let backend = &self.backends[i];
                let grant = match backend.try_acquire(&request).await? {
                    Acquire::Granted(grant) => grant,
                    Acquire::Held(_) => {
                        return Err(Error::InvalidArgument(format!(
                            "shard {:?}: the reserved key {} is held",
                            self.names[i], request.key
                        )))
                    }
                };
                // Best effort: the lease only carries the token; left
                // behind, it runs out in seconds.
                let _ = backend.release(&request.lease(grant.token)).await;
                Ok(grant.token)
            }
        };
        let mut high = None;
        for &i in &olds {
            let token = draw(i, None).await?;
            high = high.max(Some(token));
        }
        // A store in both lists is floored too: keys of the other old
        // stores may move to it.
        for &i in &news {
            draw(i, high).await?;
        }
        Ok(())
    }

    /// Refuses this process if a store at `indices` has seen an epoch more
    /// than one step from this map's, and records this epoch there
    /// (docs/sharding.md, "Adjacent steps only"). Every operation runs it
    /// on the stores it touches before touching them; `ttl` is the lease
    /// it asks for, which the record must outlive. Once an hour, the
    /// stores it does not touch are checked too.
    async fn check(&self, indices: &[usize], ttl: Duration) -> Result<()> {
        // A poisoned lock only means a panic elsewhere: check everything.
        let due = self.checked_all.lock().map_or(true, |at| {
            at.is_none_or(|at| at.elapsed() >= CHECK_ALL_EVERY)
        });
        if due {
            return self.check_all(ttl).await;
        }
        for &i in indices {
            epoch::check(
                &*self.backends[i],
                &self.names[i],
                self.epoch,
                self.joins(i),
                ttl,
            )
            .await?;
        }
        Ok(())
    }

    /// Whether store `i` joins at this step: the map is in transition and
    /// its previous map does not have the store.
    fn joins(&self, i: usize) -> bool {
        self.phase.is_some() && !self.previous.iter().any(|&(_, p)| p == i)
    }

    async fn check_all(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        for (i, (backend, name)) in self.backends.iter().zip(&self.names).enumerate() {
            epoch::check(&**backend, name, self.epoch, self.joins(i), ttl).await?;
        }
        if let Ok(mut at) = self.checked_all.lock() {
            *at = Some(started);
        }
        Ok(())
    }

    /// The stores of `route`.
    fn stores(route: Route) -> Vec<usize> {
        match route {
            Route::One(i) => vec![i],
            Route::Two {
                authority,
                follower,
            } => vec![authority, follower],
        }
    }

    /// The route of a caller's key, refused for the backend's own keys,
    /// after the epoch check of its stores.
    async fn checked_route(&self, key: &LockKey, ttl: Duration) -> Result<Route> {
        refuse_reserved(key)?;
        let route = self.route(key);
        self.check(&Self::stores(route), ttl).await?;
        Ok(route)
    }

    /// The map's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The backend of `key`'s owner among `list`, placed by `rules`.
    fn owner_in(list: &[(String, usize)], rules: &[Placement], key: &LockKey) -> usize {
        let names = list.iter().map(|(name, _)| name.as_str());
        list[config::owner(names, rules, key.as_str())].1
    }

    fn route(&self, key: &LockKey) -> Route {
        let current = Self::owner_in(&self.current, &self.current_rules, key);
        let Some(phase) = self.phase else {
            return Route::One(current);
        };
        let previous = Self::owner_in(&self.previous, &self.previous_rules, key);
        match phase {
            _ if previous == current => Route::One(current),
            Phase::Join => Route::Two {
                authority: previous,
                follower: current,
            },
            Phase::Handover => Route::Two {
                authority: current,
                follower: previous,
            },
        }
    }

    /// The lease on `shard` that pairs with `lease` (held on the key's
    /// other shard with `lease`'s token): the same key and owner, and a
    /// token above `lease`'s, as the second half of a two-shard grant
    /// always has (it was floored at the first half's token). `Ok(None)` if
    /// the key is free there; `NotHeld` if someone else (or an older lease
    /// of the same owner name) holds it.
    async fn partner(&self, shard: usize, lease: &LeaseId) -> Result<Option<LeaseId>> {
        match self.backends[shard].inspect(&lease.key).await? {
            None => Ok(None),
            Some(info) if info.owner == lease.owner && info.token > lease.token => Ok(Some(
                LeaseId::new(lease.key.clone(), lease.owner.clone(), info.token),
            )),
            Some(_) => Err(Error::not_held(lease)),
        }
    }

    /// Every shard's leases, one per key: for a moving key, its two
    /// shards' leases merged as `inspect` does.
    async fn leases(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let mut by_key: BTreeMap<LockKey, Option<LockInfo>> = BTreeMap::new();
        for (i, backend) in self.backends.iter().enumerate() {
            for lease in backend.administer()?.list(prefix).await? {
                if epoch::is_reserved(lease.key.as_str())
                    || !Self::stores(self.route(&lease.key)).contains(&i)
                {
                    // The record, or a lease its key's map no longer
                    // routes here (left from an older map).
                    continue;
                }
                let slot = by_key.entry(lease.key.clone()).or_default();
                *slot = merged(slot.take(), Some(lease));
            }
        }
        Ok(by_key.into_values().flatten().collect())
    }
}

/// The key's reserved for the epoch record are not a caller's.
fn refuse_reserved(key: &LockKey) -> Result<()> {
    if epoch::is_reserved(key.as_str()) {
        return Err(Error::InvalidKey(format!(
            "keys starting with {:?} are reserved by the sharded backend",
            epoch::RESERVED_PREFIX
        )));
    }
    Ok(())
}

/// The shorter of two grants, with the first one's token (the lease's).
fn both(first: Grant, second: &Grant) -> Grant {
    Grant::new(
        first.token,
        first.ttl.min(second.ttl),
        first.expires_at.min(second.expires_at),
    )
}

/// What a moving key's two shards say about it, as one lease: the one with
/// the lower token. A two-shard grant's token is always the lower of its
/// two (the second shard was floored above the first's), whichever step
/// granted it, so every step that reads both shards names the same token,
/// the one the holder was given (docs/sharding.md). The two halves of one
/// grant end at the earlier of their ends.
fn merged(a: Option<LockInfo>, b: Option<LockInfo>) -> Option<LockInfo> {
    match (a, b) {
        (Some(a), Some(b)) => {
            let (mut low, high) = if b.token < a.token { (b, a) } else { (a, b) };
            if low.owner == high.owner {
                low.expires_at = low.expires_at.min(high.expires_at);
                low.expires_in = low.expires_in.min(high.expires_in);
            }
            Some(low)
        }
        (a, b) => a.or(b),
    }
}

#[async_trait]
impl Backend for ShardedBackend {
    fn name(&self) -> &'static str {
        "sharded"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        request.exclusive_only(self.name())?;
        let (authority, follower) = match self.checked_route(&request.key, request.ttl).await? {
            Route::One(i) => return self.backends[i].try_acquire(request).await,
            Route::Two {
                authority,
                follower,
            } => (&self.backends[authority], &self.backends[follower]),
        };
        let first = match authority.try_acquire(request).await? {
            Acquire::Granted(grant) => grant,
            held => return Ok(held),
        };
        // Above the authority's token, so that whichever shard issues the
        // key's next token, it is above this one (docs/sharding.md).
        let floor = request
            .min_token
            .map_or(first.token, |floor| floor.max(first.token));
        let second = follower
            .try_acquire(&request.clone().with_min_token(Some(floor)))
            .await;
        match second {
            Ok(Acquire::Granted(grant)) => Ok(Acquire::Granted(both(first, &grant))),
            refused => {
                // Best effort: if this release is lost too, the lease runs
                // out by its TTL (I6).
                let _ = authority.release(&request.lease(first.token)).await;
                refused
            }
        }
    }

    /// A moving key's lease may have been granted by the adjacent step,
    /// whose authority is this step's follower: the lease's own token is on
    /// whichever shard issued it. That exact lease is confirmed first (the
    /// authority, then the follower), and only then is the other shard's
    /// half, found by owner, touched (I3). A half that is missing (a lease
    /// granted by a step that takes one shard, or a half that ran out) is
    /// taken again with the lease's token as floor, so the lease holds what
    /// this step and both its neighbours take first (docs/sharding.md).
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        lease.exclusive_only(self.name())?;
        let (authority, follower) = match self.checked_route(&lease.key, ttl).await? {
            Route::One(i) => return self.backends[i].renew(lease, ttl).await,
            Route::Two {
                authority,
                follower,
            } => (authority, follower),
        };
        let (first, other) = match self.backends[authority].renew(lease, ttl).await {
            Ok(grant) => (grant, follower),
            Err(Error::NotHeld { .. }) => {
                (self.backends[follower].renew(lease, ttl).await?, authority)
            }
            Err(e) => return Err(e),
        };
        let second = match self.partner(other, lease).await? {
            Some(half) => self.backends[other].renew(&half, ttl).await?,
            None => {
                let request = AcquireRequest::new(lease.key.clone(), lease.owner.clone(), ttl)
                    .with_min_token(Some(lease.token));
                match self.backends[other].try_acquire(&request).await? {
                    Acquire::Granted(grant) => grant,
                    Acquire::Held(_) => return Err(Error::not_held(lease)),
                }
            }
        };
        Ok(both(first, &second))
    }

    /// The leases of each store as one batch of that store, and each
    /// moving key's as `renew` takes it, all at once, each part bounded on
    /// its own (`fencelock_core::part_bound`): a client's renewer sends every lease it
    /// holds in one batch, and one unreachable shard must not make it lose
    /// the leases of the others (a site cut off, docs/multi-dc.md).
    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        let mut by_store: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut moving = Vec::new();
        for (n, renewal) in renewals.iter().enumerate() {
            match self.route(&renewal.lease.key) {
                Route::One(i) if !epoch::is_reserved(renewal.lease.key.as_str()) => {
                    by_store.entry(i).or_default().push(n);
                }
                // Refused by `renew` if reserved.
                _ => moving.push(n),
            }
        }
        let bound = fencelock_core::part_bound(renewals);
        let store_parts = by_store.into_iter().map(|(i, ns)| async move {
            let part: Vec<Renewal> = ns.iter().map(|&n| renewals[n].clone()).collect();
            let longest = part.iter().map(|r| r.ttl).max().unwrap_or_default();
            let answer = renew_part(bound, async {
                self.check(&[i], longest).await?;
                self.backends[i].renew_many(&part).await
            })
            .await;
            let results = match answer {
                Ok(results) if results.len() == ns.len() => results,
                Ok(results) => {
                    let e: Error = fencelock_core::BackendError::message(
                        self.name(),
                        fencelock_core::ErrorStatus::Transient,
                        format!(
                            "shard {:?} answered {} renewals for {}",
                            self.names[i],
                            results.len(),
                            ns.len()
                        ),
                    )
                    .into();
                    ns.iter().map(|_| Err(e.duplicate(self.name()))).collect()
                }
                Err(e) => ns.iter().map(|_| Err(e.duplicate(self.name()))).collect(),
            };
            ns.into_iter().zip(results).collect::<Vec<_>>()
        });
        let moving_parts = moving.into_iter().map(|n| async move {
            let renewal = &renewals[n];
            let result = renew_part(bound, self.renew(&renewal.lease, renewal.ttl)).await;
            vec![(n, result)]
        });
        let (stores, moving) = futures_util::future::join(
            futures_util::future::join_all(store_parts),
            futures_util::future::join_all(moving_parts),
        )
        .await;
        let mut answered: Vec<(usize, Result<Grant>)> =
            stores.into_iter().chain(moving).flatten().collect();
        answered.sort_by_key(|(n, _)| *n);
        Ok(answered.into_iter().map(|(_, result)| result).collect())
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        lease.exclusive_only(self.name())?;
        let (authority, follower) = match self.checked_route(&lease.key, Duration::ZERO).await? {
            Route::One(i) => return self.backends[i].release(lease).await,
            Route::Two {
                authority,
                follower,
            } => (authority, follower),
        };
        // As in `renew`: the exact lease first, on whichever shard issued
        // its token; the other half, found by owner, only once that has
        // been confirmed (I3). A half left behind runs out by its TTL.
        let other = match self.backends[authority].release(lease).await {
            Ok(()) => follower,
            Err(Error::NotHeld { .. }) => {
                self.backends[follower].release(lease).await?;
                authority
            }
            Err(e) => return Err(e),
        };
        match self.partner(other, lease).await {
            Ok(Some(half)) => match self.backends[other].release(&half).await {
                Ok(()) | Err(Error::NotHeld { .. }) => Ok(()),
                Err(e) => Err(e),
            },
            // Nothing of this lease there (or someone else's lease).
            Ok(None) | Err(Error::NotHeld { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The data lives with the half that carries the lease's token, the
    /// one `inspect` reports.
    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        match self.checked_route(&lease.key, Duration::ZERO).await? {
            Route::One(i) => self.backends[i].set_data(lease, data).await,
            Route::Two {
                authority,
                follower,
            } => match self.backends[authority].set_data(lease, data.clone()).await {
                Err(Error::NotHeld { .. }) => self.backends[follower].set_data(lease, data).await,
                other => other,
            },
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        match self.checked_route(key, Duration::ZERO).await? {
            Route::One(i) => self.backends[i].inspect(key).await,
            Route::Two {
                authority,
                follower,
            } => Ok(merged(
                self.backends[authority].inspect(key).await?,
                self.backends[follower].inspect(key).await?,
            )),
        }
    }

    /// Wake-ups come from the authority; no epoch check (a subscription
    /// changes nothing, and the acquire it serves is checked).
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        refuse_reserved(key)?;
        self.backends[self.route(key).authority()]
            .subscribe(key)
            .await
    }

    fencelock_core::offers!(admin);
}
