//! The in-process memory backend and fence, for tests and single-process
//! programs.
//!
//! Its clock is tokio's, so tests can drive lease expiry with
//! `tokio::time::pause()` and `advance()`. Tokens come from one counter for
//! all keys, which makes them strictly increasing per key (I2) for the life of
//! the backend; nothing survives the process.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::{
    backend::{Acquire, AcquireRequest, Backend, Capabilities, Grant, Stats},
    error::{Error, Result},
    fence::{Admission, Fence},
    types::{FencingToken, LockInfo, LockKey, Owner},
    wake::{WakeHub, WakeSubscription},
};

#[derive(Debug)]
struct Lease {
    owner: Owner,
    token: FencingToken,
    kind: Option<String>,
    data: Option<serde_json::Value>,
    acquired_at: Instant,
    expires_at: Instant,
}

#[derive(Debug)]
struct State {
    leases: HashMap<LockKey, Lease>,
    last_token: u64,
    /// Maps tokio instants to wall-clock times for [`LockInfo`].
    epoch: (Instant, DateTime<Utc>),
}

impl State {
    fn wall(&self, at: Instant) -> DateTime<Utc> {
        let (base, wall) = self.epoch;
        let offset = if at >= base {
            chrono::Duration::from_std(at - base)
        } else {
            chrono::Duration::from_std(base - at).map(|d| -d)
        };
        wall + offset.unwrap_or_default()
    }

    fn info(&self, key: &LockKey, lease: &Lease, now: Instant) -> LockInfo {
        LockInfo {
            key: key.clone(),
            owner: lease.owner.clone(),
            token: lease.token,
            kind: lease.kind.clone(),
            data: lease.data.clone(),
            acquired_at: self.wall(lease.acquired_at),
            expires_at: self.wall(lease.expires_at),
            expires_in: lease.expires_at.saturating_duration_since(now),
        }
    }

    fn live(&self, key: &LockKey, now: Instant) -> Option<&Lease> {
        self.leases.get(key).filter(|l| l.expires_at > now)
    }
}

/// In-process locks. Clones share the same locks, like connections to one
/// server.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    wakeups: WakeHub,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty lock table.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                leases: HashMap::new(),
                last_token: 0,
                epoch: (Instant::now(), Utc::now()),
            })),
            wakeups: WakeHub::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written lease:
        // every update below is a single map operation.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            wakeups: true,
            persistent: false,
            keeps_expired: true,
        }
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(holder) = state.live(&request.key, now) {
            return Ok(Acquire::Held(Some(state.info(&request.key, holder, now))));
        }
        state.last_token += 1;
        let token = FencingToken(state.last_token);
        let expires_at = now + request.ttl;
        state.leases.insert(
            request.key.clone(),
            Lease {
                owner: request.owner.clone(),
                token,
                kind: request.kind.clone(),
                data: request.data.clone(),
                acquired_at: now,
                expires_at,
            },
        );
        Ok(Acquire::Granted(Grant {
            token,
            ttl: request.ttl,
            expires_at: state.wall(expires_at),
        }))
    }

    async fn renew(
        &self,
        key: &LockKey,
        owner: &Owner,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Grant> {
        let now = Instant::now();
        let mut state = self.state();
        let expires_at = now + ttl;
        match state.leases.get_mut(key) {
            Some(lease)
                if lease.expires_at > now && lease.owner == *owner && lease.token == token =>
            {
                lease.expires_at = expires_at;
            }
            _ => {
                return Err(Error::NotHeld {
                    key: key.clone(),
                    owner: owner.clone(),
                    token,
                })
            }
        }
        Ok(Grant {
            token,
            ttl,
            expires_at: state.wall(expires_at),
        })
    }

    async fn release(&self, key: &LockKey, owner: &Owner, token: FencingToken) -> Result<bool> {
        let now = Instant::now();
        let released = {
            let mut state = self.state();
            let holds = state
                .live(key, now)
                .is_some_and(|l| l.owner == *owner && l.token == token);
            if holds {
                state.leases.remove(key);
            }
            holds
        };
        if released {
            self.wakeups.notify(key.as_str());
        }
        Ok(released)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let state = self.state();
        Ok(state.live(key, now).map(|l| state.info(key, l, now)))
    }

    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let now = Instant::now();
        let state = self.state();
        let mut found: Vec<LockInfo> = state
            .leases
            .iter()
            .filter(|(k, l)| l.expires_at > now && k.as_str().starts_with(prefix.unwrap_or("")))
            .map(|(k, l)| state.info(k, l, now))
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let removed = {
            let mut state = self.state();
            let info = state.live(key, now).map(|l| state.info(key, l, now));
            if info.is_some() {
                state.leases.remove(key);
            }
            info
        };
        if removed.is_some() {
            self.wakeups.notify(key.as_str());
        }
        Ok(removed)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let now = Instant::now();
        let released: Vec<LockKey> = {
            let mut state = self.state();
            let keys: Vec<LockKey> = state
                .leases
                .iter()
                .filter(|(_, l)| l.expires_at > now && l.owner == *owner)
                .map(|(k, _)| k.clone())
                .collect();
            for key in &keys {
                state.leases.remove(key);
            }
            keys
        };
        for key in &released {
            self.wakeups.notify(key.as_str());
        }
        Ok(released.len() as u64)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let now = Instant::now();
        let mut state = self.state();
        let before = state.leases.len();
        state.leases.retain(|_, l| l.expires_at > now);
        Ok((before - state.leases.len()) as u64)
    }

    async fn stats(&self) -> Result<Stats> {
        let now = Instant::now();
        let state = self.state();
        let live: Vec<(LockInfo, Duration)> = state
            .leases
            .iter()
            .filter(|(_, l)| l.expires_at > now)
            .map(|(k, l)| (state.info(k, l, now), now - l.acquired_at))
            .collect();
        let expired = (state.leases.len() - live.len()) as u64;
        Ok(Stats::from_leases(
            live.iter().map(|(i, d)| (i, *d)),
            expired,
        ))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        Ok(Some(self.wakeups.subscribe(key.as_str())))
    }
}

/// An in-process fence. Clones share the same records.
#[derive(Clone, Debug, Default)]
pub struct MemoryFence {
    highest: Arc<Mutex<HashMap<String, FencingToken>>>,
}

impl MemoryFence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Fence for MemoryFence {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        let current = highest.entry(resource.to_owned()).or_insert(token);
        if token >= *current {
            *current = token;
            Ok(Admission::Admitted)
        } else {
            Ok(Admission::Stale { current: *current })
        }
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(highest.get(resource).copied())
    }
}
