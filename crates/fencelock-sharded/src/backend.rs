//! [`ShardedBackend`]: routing, the two-shard path of a moving key, and the
//! operations that fan out.

use std::{fmt, time::Duration};

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Error, Grant, LeaseId, LockInfo, LockKey,
    Owner, Result, Stats, WakeSubscription,
};

use crate::{
    config::{Phase, ShardMap},
    hash, Opener,
};

/// A backend over the shards of a [`ShardMap`] (see docs/sharding.md).
pub struct ShardedBackend {
    epoch: u64,
    phase: Option<Phase>,
    /// One per distinct URL: a shard named in both lists, or two names for
    /// one store, is one backend.
    backends: Vec<std::sync::Arc<dyn Backend>>,
    /// (name, index into `backends`) of the current shards.
    current: Vec<(String, usize)>,
    /// The same for the previous map during a transition.
    previous: Vec<(String, usize)>,
    capabilities: Capabilities,
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
        for (name, url) in to_open {
            // Which shard's URL is wrong; the driver's message has no
            // password.
            let backend = open(url).await.map_err(|e| match e {
                Error::InvalidUrl(msg) => Error::InvalidUrl(format!("shard {name:?}: {msg}")),
                other => other,
            })?;
            backends.push(backend);
        }
        let all = |f: fn(&Capabilities) -> bool| backends.iter().all(|b| f(&b.capabilities()));
        if phase.is_some() && !all(|c| c.min_token) {
            return Err(Error::Unsupported(
                "a shard map in transition needs token floors (min_token) on every shard".into(),
            ));
        }
        // What every shard offers, minus what a key taken on two shards
        // cannot keep: read-write locks, watches and one-round-trip batches.
        let capabilities = Capabilities::default()
            .with_wakeups(all(|c| c.wakeups))
            .with_persistent(all(|c| c.persistent))
            .with_keeps_expired(all(|c| c.keeps_expired))
            .with_min_token(all(|c| c.min_token))
            .with_set_data(all(|c| c.set_data));
        Ok(Self {
            epoch: map.epoch,
            phase,
            backends,
            current: current_idx,
            previous: previous_idx,
            capabilities,
        })
    }

    /// The map's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn owner_in(list: &[(String, usize)], key: &LockKey) -> usize {
        list[hash::owner(list.iter().map(|(name, _)| name.as_str()), key.as_str())].1
    }

    fn route(&self, key: &LockKey) -> Route {
        let current = Self::owner_in(&self.current, key);
        let Some(phase) = self.phase else {
            return Route::One(current);
        };
        let previous = Self::owner_in(&self.previous, key);
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

    fn authority(&self, key: &LockKey) -> &dyn Backend {
        &*self.backends[self.route(key).authority()]
    }

    /// `lease`'s counterpart on the follower: the same key and owner, with
    /// the token the follower issued, if that owner holds it there.
    async fn follower_lease(&self, follower: usize, lease: &LeaseId) -> Result<Option<LeaseId>> {
        Ok(self.backends[follower]
            .inspect(&lease.key)
            .await?
            .filter(|info| info.owner == lease.owner)
            .map(|info| LeaseId::new(lease.key.clone(), lease.owner.clone(), info.token)))
    }

    /// Every shard's leases that stand for their key (on its authority).
    async fn leases(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let mut leases = Vec::new();
        for (i, backend) in self.backends.iter().enumerate() {
            for lease in backend.list(prefix).await? {
                if self.route(&lease.key).authority() == i {
                    leases.push(lease);
                }
            }
        }
        leases.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
        Ok(leases)
    }
}

/// The shorter of two grants, with the authority's token.
fn both(authority: Grant, follower: &Grant) -> Grant {
    Grant::new(
        authority.token,
        authority.ttl.min(follower.ttl),
        authority.expires_at.min(follower.expires_at),
    )
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
        let (authority, follower) = match self.route(&request.key) {
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

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let (authority, follower) = match self.route(&lease.key) {
            Route::One(i) => return self.backends[i].renew(lease, ttl).await,
            Route::Two {
                authority,
                follower,
            } => (authority, follower),
        };
        // As in `release`: the follower only after the authority confirmed
        // this exact lease.
        let first = self.backends[authority].renew(lease, ttl).await?;
        let other = self
            .follower_lease(follower, lease)
            .await?
            .ok_or_else(|| Error::not_held(lease))?;
        let second = self.backends[follower].renew(&other, ttl).await?;
        Ok(both(first, &second))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        let (authority, follower) = match self.route(&lease.key) {
            Route::One(i) => return self.backends[i].release(lease).await,
            Route::Two {
                authority,
                follower,
            } => (authority, follower),
        };
        // The follower's lease is found by owner, and an owner name may be
        // shared by a stale holder and its successor: it is only touched
        // once the authority has confirmed this exact lease (I3). A lease
        // left on the follower runs out by its TTL.
        self.backends[authority].release(lease).await?;
        if let Some(other) = self.follower_lease(follower, lease).await? {
            match self.backends[follower].release(&other).await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        self.authority(&lease.key).set_data(lease, data).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.authority(key).inspect(key).await
    }

    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.leases(prefix).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        match self.route(key) {
            Route::One(i) => self.backends[i].force_release(key).await,
            Route::Two {
                authority,
                follower,
            } => {
                let first = self.backends[authority].force_release(key).await?;
                let second = self.backends[follower].force_release(key).await?;
                Ok(first.or(second))
            }
        }
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        // During a transition a moving key is held on two shards: the
        // answer counts it once, as `list` shows it.
        let counted = match self.phase {
            Some(_) => Some(
                self.leases(None)
                    .await?
                    .iter()
                    .filter(|l| &l.owner == owner)
                    .count() as u64,
            ),
            None => None,
        };
        let mut removed = 0;
        for backend in &self.backends {
            removed += backend.release_all(owner).await?;
        }
        Ok(counted.map_or(removed, |c| c.min(removed)))
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let mut removed = 0;
        for backend in &self.backends {
            removed += backend.cleanup_expired().await?;
        }
        Ok(removed)
    }

    async fn stats(&self) -> Result<Stats> {
        let mut expired = 0;
        for backend in &self.backends {
            expired += backend.stats().await?.expired_not_cleaned;
        }
        let leases = self.leases(None).await?;
        // Hold times on each shard's own clock: its "now" is the lease's
        // end minus what remains of it.
        let held = leases.iter().map(|l| {
            let lived = l
                .expires_at
                .signed_duration_since(l.acquired_at)
                .to_std()
                .unwrap_or_default();
            (l, lived.saturating_sub(l.expires_in))
        });
        Ok(Stats::from_leases(held, expired))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        self.authority(key).subscribe(key).await
    }
}
