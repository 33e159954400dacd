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

use tokio::sync::broadcast;

use crate::{
    backend::{Acquire, AcquireAll, AcquireRequest, Backend, Capabilities, Grant},
    error::{Error, Result},
    fence::{Admission, Fence, FencedValue},
    types::{FencingToken, LeaseId, LockInfo, LockKey, LockMode, Owner},
    wake::{WakeHub, WakeSubscription},
    watch::{HolderChange, Watch, WatchFeeder},
};

mod admin;
mod shared;

#[derive(Debug)]
struct Lease {
    owner: Owner,
    token: FencingToken,
    kind: Option<String>,
    data: Option<serde_json::Value>,
    acquired_at: Instant,
    expires_at: Instant,
    mode: LockMode,
}

#[derive(Debug)]
struct State {
    /// Exclusive leases (writers and plain locks).
    leases: HashMap<LockKey, Lease>,
    /// Reader leases per key, expired ones included until cleanup or the
    /// next grant on the key.
    readers: HashMap<LockKey, Vec<Lease>>,
    /// A waiting writer's intent per key: its owner and when it ends.
    intents: HashMap<LockKey, (Owner, Instant)>,
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
            mode: lease.mode,
        }
    }

    fn live(&self, key: &LockKey, now: Instant) -> Option<&Lease> {
        self.leases.get(key).filter(|l| l.expires_at > now)
    }

    /// The unexpired reader of `key` whose lease ends last: what a waiting
    /// writer is told it waits for.
    fn last_reader(&self, key: &LockKey, now: Instant) -> Option<&Lease> {
        self.readers
            .get(key)?
            .iter()
            .filter(|l| l.expires_at > now)
            .max_by_key(|l| l.expires_at)
    }

    /// Who keeps `key` from a writer: its unexpired exclusive holder, else
    /// its last unexpired reader.
    fn holder(&self, key: &LockKey, now: Instant) -> Option<LockInfo> {
        let lease = self.live(key, now).or_else(|| self.last_reader(key, now))?;
        Some(self.info(key, lease, now))
    }

    /// Every unexpired lease, exclusive and shared.
    fn all_live(&self, now: Instant) -> impl Iterator<Item = (&LockKey, &Lease)> {
        let readers = self
            .readers
            .iter()
            .flat_map(|(k, ls)| ls.iter().map(move |l| (k, l)));
        self.leases
            .iter()
            .chain(readers)
            .filter(move |(_, l)| l.expires_at > now)
    }

    /// The next token of the counter (one counter for every key), above
    /// the request's floor when it has one. The counter does not move when
    /// the token would pass [`FencingToken::MAX`].
    fn next_token(&mut self, request: &AcquireRequest) -> Result<FencingToken> {
        let token = request.issued(self.last_token.max(request.floor()?) + 1)?;
        self.last_token = token.get();
        Ok(token)
    }

    fn reader_mut(&mut self, lease: &LeaseId, now: Instant) -> Option<&mut Lease> {
        self.readers
            .get_mut(&lease.key)?
            .iter_mut()
            .find(|l| l.expires_at > now && l.owner == lease.owner && l.token == lease.token)
    }

    /// Removes the reader lease `lease` if it is live; whether it was.
    fn remove_reader(&mut self, lease: &LeaseId, now: Instant) -> bool {
        let Some(readers) = self.readers.get_mut(&lease.key) else {
            return false;
        };
        let before = readers.len();
        readers
            .retain(|l| !(l.expires_at > now && l.owner == lease.owner && l.token == lease.token));
        let removed = readers.len() < before;
        if readers.is_empty() {
            self.readers.remove(&lease.key);
        }
        removed
    }
}

impl Lease {
    /// `request`'s lease with `token`, granted `now`, in the request's mode.
    fn of(request: &AcquireRequest, token: FencingToken, now: Instant) -> Self {
        Lease {
            owner: request.owner.clone(),
            token,
            kind: request.kind.clone(),
            data: request.data.clone(),
            acquired_at: now,
            expires_at: now + request.ttl,
            mode: request.mode,
        }
    }

    fn id(&self, key: &LockKey) -> LeaseId {
        LeaseId::new(key.clone(), self.owner.clone(), self.token).with_mode(self.mode)
    }
}

/// A grant or a release, as told to the watchers: expiries are not events
/// of the table (nothing happens when a lease runs out), so each watcher
/// times them itself.
#[derive(Clone, Debug)]
enum TableEvent {
    Granted { info: LockInfo, expires_at: Instant },
    Released(LeaseId),
}

/// How many table events a slow watcher may fall behind before it re-reads
/// the table instead.
const EVENT_BUFFER: usize = 1024;

/// In-process locks. Clones share the same locks, like connections to one
/// server.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    wakeups: WakeHub,
    events: broadcast::Sender<TableEvent>,
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
                readers: HashMap::new(),
                intents: HashMap::new(),
                last_token: 0,
                epoch: (Instant::now(), Utc::now()),
            })),
            wakeups: WakeHub::new(),
            events: broadcast::channel(EVENT_BUFFER).0,
        }
    }

    /// Tells the watchers (if any) about a release. Called with the table
    /// locked, so that watchers see releases and grants in the order the
    /// table saw them (a woken waiter's grant never overtakes the release).
    fn announce_release(&self, _table: &State, lease: &LeaseId) {
        let _ = self.events.send(TableEvent::Released(lease.clone()));
    }

    /// Wakes the waiters of a released lease (after the table is unlocked).
    fn released(&self, lease: LeaseId) {
        self.wakeups.notify(lease.key.as_str());
    }

    /// The current lease of `key` and when it ends, if unexpired.
    fn current(&self, key: &LockKey) -> Option<(LeaseId, Instant)> {
        let now = Instant::now();
        let state = self.state();
        state.live(key, now).map(|l| (l.id(key), l.expires_at))
    }

    /// Writes `request`'s lease with `token` on a key found free, and
    /// tells the watchers.
    fn grant(
        &self,
        state: &mut State,
        request: &AcquireRequest,
        token: FencingToken,
        now: Instant,
    ) -> Grant {
        state.readers.remove(&request.key);
        if state
            .intents
            .get(&request.key)
            .is_some_and(|(owner, _)| *owner == request.owner)
        {
            state.intents.remove(&request.key);
        }
        let lease = Lease::of(request, token, now);
        let expires_at = lease.expires_at;
        state.leases.insert(request.key.clone(), lease);
        let grant = Grant::new(token, request.ttl, state.wall(expires_at));
        let info = state
            .leases
            .get(&request.key)
            .map(|l| state.info(&request.key, l, now));
        // Sent under the table's lock, like releases (see `announce_release`).
        if let Some(info) = info {
            let _ = self.events.send(TableEvent::Granted { info, expires_at });
        }
        grant
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
        Capabilities::default()
            .with_wakeups(true)
            .with_keeps_expired(true)
            .with_min_token(true)
            .with_watch(true)
            .with_set_data(true)
            .with_shared(true)
            .with_atomic_multi(true)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if request.mode == LockMode::Shared {
            return self.acquire_reader(request);
        }
        let now = Instant::now();
        let mut state = self.state();
        if let Some(holder) = state.holder(&request.key, now) {
            return Ok(Acquire::Held(Some(holder)));
        }
        let token = state.next_token(request)?;
        let grant = self.grant(&mut state, request, token, now);
        drop(state);
        Ok(Acquire::Granted(grant))
    }

    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        for request in requests {
            request.exclusive_only(self.name())?;
        }
        let now = Instant::now();
        let mut state = self.state();
        for (index, request) in requests.iter().enumerate() {
            if let Some(holder) = state.holder(&request.key, now) {
                return Ok(AcquireAll::Held {
                    index,
                    holder: Some(holder),
                });
            }
        }
        // Every token is drawn before any lease is written, so a floor that
        // leaves no token fails the call with nothing granted (the tokens
        // drawn meanwhile are skipped, which I2 allows).
        let tokens = requests
            .iter()
            .map(|r| state.next_token(r))
            .collect::<Result<Vec<_>>>()?;
        let grants = requests
            .iter()
            .zip(tokens)
            .map(|(request, token)| self.grant(&mut state, request, token, now))
            .collect();
        drop(state);
        Ok(AcquireAll::Granted(grants))
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        if lease.mode == LockMode::Shared {
            return self.renew_reader(lease, ttl);
        }
        let now = Instant::now();
        let mut state = self.state();
        let expires_at = now + ttl;
        match state.leases.get_mut(&lease.key) {
            Some(held)
                if held.expires_at > now
                    && held.owner == lease.owner
                    && held.token == lease.token =>
            {
                held.expires_at = expires_at;
            }
            _ => return Err(Error::not_held(lease)),
        }
        Ok(Grant::new(lease.token, ttl, state.wall(expires_at)))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        if lease.mode == LockMode::Shared {
            return self.release_reader(lease);
        }
        let now = Instant::now();
        {
            let mut state = self.state();
            let holds = state
                .live(&lease.key, now)
                .is_some_and(|l| l.owner == lease.owner && l.token == lease.token);
            if !holds {
                return Err(Error::not_held(lease));
            }
            state.leases.remove(&lease.key);
            self.announce_release(&state, lease);
        }
        self.released(lease.clone());
        Ok(())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let state = self.state();
        let current = state.live(key, now).or_else(|| state.last_reader(key, now));
        Ok(current.map(|l| state.info(key, l, now)))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        Ok(Some(self.wakeups.subscribe(key.as_str())))
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let now = Instant::now();
        let mut state = self.state();
        match state.leases.get_mut(&lease.key) {
            Some(held)
                if held.expires_at > now
                    && held.owner == lease.owner
                    && held.token == lease.token =>
            {
                held.data = data;
                Ok(())
            }
            _ => Err(Error::not_held(lease)),
        }
    }

    async fn watch(&self, key: &LockKey) -> Result<Watch> {
        let (feeder, watch) = Watch::channel();
        // Subscribed before the table is read, so that no change between the
        // read and the subscription is missed.
        let events = self.events.subscribe();
        let current = self.current(key);
        tokio::spawn(feed_watch(
            self.clone(),
            key.clone(),
            current,
            events,
            feeder,
        ));
        Ok(watch)
    }

    crate::offers!(admin, write_intents);
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One watcher: follows the table's events for `key` and times the current
/// lease's end itself, until the watch is dropped.
async fn feed_watch(
    backend: MemoryBackend,
    key: LockKey,
    mut current: Option<(LeaseId, Instant)>,
    mut events: broadcast::Receiver<TableEvent>,
    feeder: WatchFeeder,
) {
    loop {
        let change = tokio::select! {
            biased;
            _ = feeder.closed() => return,
            event = events.recv() => match event {
                Ok(TableEvent::Granted { info, expires_at }) if info.key == key => {
                    // A takeover of an expired lease whose end this watcher
                    // has not timed yet: report the expiry first.
                    if let Some((old, _)) = current.take() {
                        if old.token != info.token && !feeder.send(Ok(HolderChange::Expired(old))).await {
                            return;
                        }
                    }
                    current = Some((LeaseId::new(key.clone(), info.owner.clone(), info.token), expires_at));
                    HolderChange::Acquired(info)
                }
                Ok(TableEvent::Released(lease)) if lease.key == key => {
                    if current.as_ref().is_some_and(|(c, _)| *c == lease) {
                        current = None;
                    }
                    HolderChange::Released(lease)
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Fell behind: the table itself says who holds the key
                    // now; report the difference.
                    let latest = backend.current(&key);
                    if latest.as_ref().map(|(l, _)| l) == current.as_ref().map(|(l, _)| l) {
                        continue;
                    }
                    if let Some((old, ends)) = current.take() {
                        let gone = if ends <= Instant::now() {
                            HolderChange::Expired(old)
                        } else {
                            HolderChange::Released(old)
                        };
                        if !feeder.send(Ok(gone)).await {
                            return;
                        }
                    }
                    current = latest;
                    let Some((lease, _)) = &current else { continue };
                    match backend.inspect(&key).await {
                        Ok(Some(info)) if info.token == lease.token => HolderChange::Acquired(info),
                        _ => continue,
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = sleep_until_some(current.as_ref().map(|(_, at)| *at)) => {
                let Some((lease, _)) = current.take() else { continue };
                match backend.current(&key) {
                    // Renewed meanwhile: time the new end.
                    Some((now, at)) if now == lease => {
                        current = Some((now, at));
                        continue;
                    }
                    _ => HolderChange::Expired(lease),
                }
            }
        };
        if !feeder.send(Ok(change)).await {
            return;
        }
    }
}

/// An in-process fence. Clones share the same records.
#[derive(Clone, Debug, Default)]
pub struct MemoryFence {
    highest: Arc<Mutex<HashMap<String, Highest>>>,
}

/// What a fence remembers of one resource.
#[derive(Clone, Debug)]
struct Highest {
    /// The highest token admitted in either mode.
    any: FencingToken,
    /// The highest exclusive (writer) token admitted, if any.
    writer: Option<FencingToken>,
    /// The value last stored with an admission ([`Fence::try_admit_value`]).
    value: Option<FencedValue>,
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
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(highest.get(resource).map(|h| h.any))
    }

    fn shared(&self) -> bool {
        true
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(admit_in(&mut highest, resource, token, mode))
    }

    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        let admission = admit_in(&mut highest, resource, token, LockMode::Exclusive);
        if admission == Admission::Admitted {
            if let Some(record) = highest.get_mut(resource) {
                record.value = Some(FencedValue::new(token, value.to_vec()));
            }
        }
        Ok(admission)
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(highest.get(resource).and_then(|h| h.value.clone()))
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(highest.get(resource).and_then(|h| h.writer))
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(highest.remove(resource).map(|h| h.any))
    }
}

/// The fence rule on the records of a [`MemoryFence`], under its lock.
fn admit_in(
    highest: &mut HashMap<String, Highest>,
    resource: &str,
    token: FencingToken,
    mode: LockMode,
) -> Admission {
    let current = highest.entry(resource.to_owned()).or_insert(Highest {
        any: token,
        writer: None,
        value: None,
    });
    let (floor, writer) = match mode {
        LockMode::Exclusive => (current.any, Some(token)),
        LockMode::Shared => (current.writer.unwrap_or(token), current.writer),
    };
    if token >= floor {
        current.any = current.any.max(token);
        current.writer = writer;
        Admission::Admitted
    } else {
        Admission::Stale { current: floor }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter's end: the last token is granted once, then every grant
    /// is `TokensExhausted` on the key asked for, and the counter stays.
    #[tokio::test(start_paused = true)]
    async fn the_counters_end_is_a_typed_error() -> Result<()> {
        let backend = MemoryBackend::new();
        backend.state().last_token = FencingToken::MAX.get() - 1;
        let request = |k: &str| {
            Ok::<_, Error>(AcquireRequest::new(
                LockKey::new(k)?,
                Owner::new("o")?,
                Duration::from_secs(60),
            ))
        };
        let last = backend.try_acquire(&request("a")?).await?;
        assert!(matches!(last, Acquire::Granted(g) if g.token == FencingToken::MAX));
        for spent in [
            backend.try_acquire(&request("b")?).await,
            backend
                .try_acquire(&request("b")?.with_mode(LockMode::Shared))
                .await,
        ] {
            assert!(
                matches!(&spent, Err(Error::TokensExhausted { key }) if key.as_str() == "b"),
                "{spent:?}"
            );
        }
        let spent = backend.try_acquire_all(&[request("c")?]).await;
        assert!(
            matches!(spent, Err(Error::TokensExhausted { .. })),
            "{spent:?}"
        );
        assert_eq!(backend.state().last_token, FencingToken::MAX.get());
        Ok(())
    }
}
