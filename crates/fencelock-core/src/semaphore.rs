//! Counting semaphores made of leases (`docs/semaphore.md`).
//!
//! Permit `i` of a semaphore of `N` is the lease on the slot key
//! `fencelock/semaphore/<name>/<i>`, so every permit is an ordinary lease:
//! renewed by the client's one renewer, fenced by its own token, and back
//! to the pool when its holder stops renewing. The semaphore's `N` travels
//! in each permit's data, which is how a client asking for another `N`
//! finds out (see [`Error::PermitsMismatch`]).

use std::{fmt, time::Duration};

use futures_util::future::select_all;
use rand::Rng;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::{
    backoff::Backoff,
    client::{attempt, Attempt, LockClient, LockRequest, WAIT_BACKOFF},
    deadline::bounded,
    error::{Error, Result},
    guard::{GuardHandle, LockGuard},
    types::{LockInfo, LockKey},
    wake::WakeSubscription,
};

/// Largest number of permits a semaphore may have: each permit is a key,
/// and a waiter may try every one of them per round.
pub const MAX_PERMITS: u32 = 10_000;
/// Where the slot keys of every semaphore live.
pub const SEMAPHORE_PREFIX: &str = "fencelock/semaphore/";
/// Up to this many permits, a waiter subscribes to wake-ups on every slot;
/// above it, one subscription per slot would cost more than backing off.
const MAX_WAKEUP_SLOTS: u32 = 64;
/// The member of a permit's data holding the semaphore's description.
const META: &str = "fencelock_semaphore";
/// The member holding the caller's own data.
const USER_DATA: &str = "data";

/// The key of permit `slot` of semaphore `name`: the key its lease is on,
/// and the resource name to fence its token with.
pub fn semaphore_slot_key(name: &str, slot: u32) -> String {
    format!("{SEMAPHORE_PREFIX}{name}/{slot}")
}

/// What a permit's data says: the semaphore's size and the caller's data.
fn unwrap_data(data: Option<&Value>) -> Option<(u32, Option<Value>)> {
    let object = data?.as_object()?;
    let permits = object.get(META)?.get("permits")?.as_u64()?;
    Some((u32::try_from(permits).ok()?, object.get(USER_DATA).cloned()))
}

impl LockClient {
    /// Starts building an acquisition of one permit of the semaphore `name`
    /// of `permits` permits. Each permit is a lease on its own slot key
    /// ([`semaphore_slot_key`]) with its own fencing token.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use fencelock_core::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let client = LockClient::new(Arc::new(MemoryBackend::new()));
    /// let permit = client.semaphore("encoders", 2).acquire().await?;
    /// assert_eq!(permit.key().as_str(), format!("fencelock/semaphore/encoders/{}", permit.slot()));
    /// assert_eq!(client.semaphore("encoders", 2).count().await?, 1);
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> SemaphoreRequest<'_> {
        SemaphoreRequest {
            name: name.into(),
            permits,
            permit: self.lock(String::new()),
        }
    }
}

/// A permit acquisition being built:
/// `client.semaphore("name", n).ttl(..).wait(..).acquire()`.
#[derive(Debug)]
#[must_use = "a semaphore request does nothing until acquired"]
pub struct SemaphoreRequest<'a> {
    name: String,
    permits: u32,
    /// The options the permit's lease is taken with (its key is the slot's).
    permit: LockRequest<'a>,
}

impl SemaphoreRequest<'_> {
    /// Lease length of the permit; renewal extends it by this much each time.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.permit = self.permit.ttl(ttl);
        self
    }

    /// How long to wait for a free permit (default: not at all). One
    /// deadline for the whole call, however many slots it tries.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.permit = self.permit.wait(wait);
        self
    }

    /// A label stored with the permit's lease.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.permit = self.permit.kind(kind);
        self
    }

    /// JSON metadata stored with the permit (returned as it was by
    /// [`holders`](Self::holders)). The semaphore's size is stored beside
    /// it, which takes a few dozen bytes of the 64 KiB limit.
    pub fn data(mut self, data: Value) -> Self {
        self.permit = self.permit.data(data);
        self
    }

    /// Renewal period (default: a third of the TTL).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.permit = self.permit.renew_every(period);
        self
    }

    /// Checks the name and the number of permits.
    fn validate_shape(&self) -> Result<()> {
        if self.permits == 0 || self.permits > MAX_PERMITS {
            return Err(Error::InvalidArgument(format!(
                "a semaphore has 1–{MAX_PERMITS} permits, not {}",
                self.permits
            )));
        }
        LockKey::new(self.name.as_str())?;
        // The longest slot key must be a valid key too.
        LockKey::new(semaphore_slot_key(&self.name, self.permits - 1))?;
        Ok(())
    }

    fn timeout(&self) -> Error {
        if !self.permit.wait.is_zero() {
            let backend = self.permit.client.inner.backend.name();
            ::metrics::counter!(crate::metrics::ACQUIRE_TIMEOUTS, "backend" => backend)
                .increment(1);
        }
        match LockKey::new(self.name.as_str()) {
            Ok(key) => Error::Timeout {
                key,
                waited: self.permit.wait,
            },
            Err(e) => e,
        }
    }

    /// A lease of another size is a mismatch; a lease without a size (the
    /// slot key taken by a plain lock) only makes the slot busy.
    fn check_size(&self, holder: &LockInfo) -> Result<()> {
        match unwrap_data(holder.data.as_ref()) {
            Some((existing, _)) if existing != self.permits => Err(Error::PermitsMismatch {
                name: self.name.clone(),
                existing,
                requested: self.permits,
            }),
            _ => Ok(()),
        }
    }

    /// Takes a free permit, waiting up to [`wait`](Self::wait) for one.
    ///
    /// Tries slot 0 first and then the others in a random rotation (so that
    /// concurrent acquirers spread out), and while waiting sleeps until a wake-up on any slot
    /// (semaphores of at most 64 permits, on backends with wake-ups), the
    /// earliest expiry among the holders, or a jittered backoff.
    ///
    /// Every grant is followed by one read of the semaphore's slots (a
    /// `list` of its prefix; a `SCAN` on Redis) before it becomes a permit.
    ///
    /// [`Error::PermitsMismatch`], taking nothing, when a live permit of this
    /// semaphore was taken with another number of permits: met on the way,
    /// or found by that read (`docs/semaphore.md` says why no two holders
    /// of different sizes can both hold);
    /// [`Error::Timeout`] (naming the semaphore) when the deadline passes.
    pub async fn acquire(self) -> Result<Permit> {
        let inner = &self.permit.client.inner;
        if inner.renewer.is_closed() {
            return Err(Error::ClientClosed);
        }
        self.validate_shape()?;
        let mut meta = json!({ META: { "permits": self.permits } });
        if let Some(data) = &self.permit.data {
            meta[USER_DATA] = data.clone();
        }
        let (request, config) = self
            .permit
            .for_key(semaphore_slot_key(&self.name, 0))
            .data(meta)
            .validate()?;
        let backend = &inner.backend;
        let started = Instant::now();
        let deadline = started.checked_add(self.permit.wait);
        let past = |now: Instant| deadline.is_some_and(|d| now >= d);

        let mut wakeups = if self.permit.wait.is_zero()
            || !backend.capabilities().wakeups
            || self.permits > MAX_WAKEUP_SLOTS
        {
            Vec::new()
        } else {
            self.subscribe_all(inner.op_timeout.min(self.permit.wait))
                .await
        };

        let mut backoff = Backoff::new(WAIT_BACKOFF.0, WAIT_BACKOFF.1);
        loop {
            // Slot 0 first, so that a semaphore in use nearly always has
            // slot 0 held and every acquisition learns its size there;
            // the others in a random rotation, so that racers spread out.
            let others = self.permits - 1;
            let start = if others == 0 {
                0
            } else {
                rand::thread_rng().gen_range(0..others)
            };
            let mut earliest: Option<Duration> = None;
            for step in 0..self.permits {
                let slot = if step == 0 {
                    0
                } else {
                    1 + (start + step - 1) % others
                };
                let mut slot_request = request.clone();
                slot_request.key = LockKey::new(semaphore_slot_key(&self.name, slot))?;
                match attempt(
                    inner,
                    &slot_request,
                    config,
                    deadline,
                    started,
                    Duration::ZERO,
                )
                .await?
                {
                    Attempt::Granted(guard) => {
                        // A grant is a permit only once a read after it
                        // found no live permit of another size on any slot:
                        // of two holders of different sizes, the later
                        // reader sees the earlier grant (the argument is in
                        // docs/semaphore.md, "The number of permits never
                        // changes silently").
                        let unchecked = match self.other_size().await {
                            Ok(None) => {
                                return Ok(Permit {
                                    guard,
                                    name: self.name.clone(),
                                    slot,
                                    permits: self.permits,
                                })
                            }
                            Ok(Some(existing)) => Error::PermitsMismatch {
                                name: self.name.clone(),
                                existing,
                                requested: self.permits,
                            },
                            Err(e) => e,
                        };
                        // Taking nothing: the grant goes back before the
                        // answer (or, if the backend does not answer the
                        // release, ends by expiry).
                        if let Err(e) = guard.release().await {
                            tracing::debug!(error = %e, "could not give back an unchecked permit");
                        }
                        match unchecked {
                            // Unchecked is not granted: try again while the
                            // wait lasts, as after a failed try.
                            e if e.is_transient() && !past(Instant::now()) => {
                                tracing::debug!(error = %e, "could not check the semaphore's size; retrying");
                            }
                            e => return Err(e),
                        }
                    }
                    Attempt::Held(Some(holder)) => {
                        self.check_size(&holder)?;
                        earliest =
                            Some(earliest.map_or(holder.expires_in, |e| e.min(holder.expires_in)));
                    }
                    Attempt::Held(None) => {
                        // The backend did not say who holds it (a race inside
                        // its statement): ask, so that a mismatch is not missed.
                        // A transient failure to ask only skips the check.
                        match bounded(
                            inner.op_timeout,
                            "inspect",
                            backend.inspect(&slot_request.key),
                        )
                        .await
                        {
                            Ok(Some(holder)) => self.check_size(&holder)?,
                            Ok(None) => {}
                            Err(e) if e.is_transient() => {
                                tracing::debug!(error = %e, "could not inspect a busy slot");
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Attempt::Retry => {}
                }
                // One deadline for the whole call; a call without a wait
                // still tries every slot once.
                if !self.permit.wait.is_zero() && past(Instant::now()) {
                    return Err(self.timeout());
                }
            }
            let now = Instant::now();
            if past(now) {
                return Err(self.timeout());
            }
            let mut pause = backoff.next_pause();
            if let Some(deadline) = deadline {
                pause = pause.min(deadline - now);
            }
            if let Some(earliest) = earliest {
                pause = pause.min(earliest + Duration::from_millis(1));
            }
            if wakeups.is_empty() {
                tokio::time::sleep(pause).await;
            } else {
                let woken = select_all(wakeups.iter_mut().map(|w| Box::pin(w.woken())));
                let alive = tokio::select! {
                    (alive, _, _) = woken => Some(alive),
                    _ = tokio::time::sleep(pause) => None,
                };
                match alive {
                    Some(true) => backoff.reset(),
                    Some(false) => {
                        tracing::debug!("a wake-up source ended; waiting with backoff");
                        wakeups.clear();
                    }
                    None => {}
                }
            }
        }
    }

    /// One subscription per slot, all or none: a waiter that missed the
    /// wake-ups of some slots would sleep through their releases.
    async fn subscribe_all(&self, bound: Duration) -> Vec<WakeSubscription> {
        let backend = &self.permit.client.inner.backend;
        let mut subs = Vec::with_capacity(self.permits as usize);
        for slot in 0..self.permits {
            let Ok(key) = LockKey::new(semaphore_slot_key(&self.name, slot)) else {
                return Vec::new();
            };
            match tokio::time::timeout(bound, backend.subscribe(&key)).await {
                Ok(Ok(Some(sub))) => subs.push(sub),
                _ => {
                    tracing::debug!("no wake-ups for every slot; waiting with backoff");
                    return Vec::new();
                }
            }
        }
        subs
    }

    /// One attempt over every slot, no waiting: `Ok(None)` when all permits
    /// are taken.
    pub async fn try_acquire(self) -> Result<Option<Permit>> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(permit) => Ok(Some(permit)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The permits currently held, by slot: one `list` of the semaphore's
    /// slot keys (a scan on Redis). Includes permits taken with another
    /// size; each says its own.
    pub async fn holders(&self) -> Result<Vec<PermitHolder>> {
        LockKey::new(self.name.as_str())?;
        let mut holders: Vec<PermitHolder> = self
            .slot_leases()
            .await?
            .into_iter()
            .filter_map(|(slot, mut lease)| {
                let (permits, data) = unwrap_data(lease.data.as_ref())?;
                lease.data = data;
                Some(PermitHolder {
                    slot,
                    permits,
                    lease,
                })
            })
            .collect();
        holders.sort_by_key(|h| h.slot);
        Ok(holders)
    }

    /// The live leases on this semaphore's slot keys, with their slots: one
    /// `list` of the prefix `fencelock/semaphore/<name>/`.
    async fn slot_leases(&self) -> Result<Vec<(u32, LockInfo)>> {
        let inner = &self.permit.client.inner;
        let prefix = format!("{SEMAPHORE_PREFIX}{}/", self.name);
        let leases = bounded(
            inner.op_timeout,
            "list",
            inner.backend.administer()?.list(Some(&prefix)),
        )
        .await?;
        Ok(leases
            .into_iter()
            .filter_map(|lease| {
                // Slots of a semaphore whose name extends this one's with
                // `/…` share the prefix; their rest is not a number. Only
                // the spelling `semaphore_slot_key` writes is a slot
                // (`parse` also takes `+1` and `01`).
                let rest = lease.key.as_str().strip_prefix(&prefix)?;
                let slot: u32 = rest.parse().ok()?;
                (slot.to_string() == rest).then_some((slot, lease))
            })
            .collect())
    }

    /// The size of a live permit of this semaphore taken with another
    /// number of permits, if there is one. Leases on slot keys without a
    /// size (plain locks) only make their slots busy.
    async fn other_size(&self) -> Result<Option<u32>> {
        Ok(self
            .slot_leases()
            .await?
            .iter()
            .filter_map(|(_, lease)| unwrap_data(lease.data.as_ref()))
            .map(|(permits, _)| permits)
            .find(|&permits| permits != self.permits))
    }

    /// How many permits are held now (see [`holders`](Self::holders)).
    pub async fn count(&self) -> Result<usize> {
        Ok(self.holders().await?.len())
    }
}

/// A held permit as [`SemaphoreRequest::holders`] reports it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The permit's slot (`0..permits`).
    pub slot: u32,
    /// The semaphore's size the permit was taken with.
    pub permits: u32,
    /// The permit's lease, with the holder's own data (the size removed).
    pub lease: LockInfo,
}

/// A held permit: a [`LockGuard`] on the permit's slot key. Dereferences to
/// [`GuardHandle`] for `token()`, `check()`, `lost()` and the rest; the
/// token fences the slot key ([`GuardHandle::key`]), not the semaphore's
/// name, since tokens only grow per key.
///
/// Dropping a permit releases it in the background, like a guard.
#[must_use = "dropping a permit releases it"]
pub struct Permit {
    guard: LockGuard,
    name: String,
    slot: u32,
    permits: u32,
}

impl Permit {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This permit's slot, in `0..permits`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The semaphore's number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The guard of the permit's lease.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// A cloneable handle that outlives borrows of the permit.
    pub fn handle(&self) -> GuardHandle {
        self.guard.handle()
    }

    /// Stops renewal and gives the permit back now (see
    /// [`LockGuard::release`]).
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }

    /// The permit's guard, for code that handles any held lease alike.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Stops renewing without releasing (see [`LockGuard::detach`]).
    pub fn detach(self) {
        self.guard.detach();
    }
}

impl std::ops::Deref for Permit {
    type Target = GuardHandle;
    fn deref(&self) -> &GuardHandle {
        &self.guard
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.name)
            .field("slot", &self.slot)
            .field("permits", &self.permits)
            .field("guard", &self.guard)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use std::sync::Arc;

    use super::*;
    use crate::{fault::FaultyBackend, Backend, MemoryBackend};

    /// The memory backend behind a wrapper whose next `n` lists fail as a
    /// lost connection would; the memory backend is returned too, to look
    /// at past the wrapper.
    fn failing(n: usize) -> (Arc<FaultyBackend>, Arc<MemoryBackend>, LockClient) {
        let memory = Arc::new(MemoryBackend::new());
        let backend = FaultyBackend::new(memory.clone());
        backend.fail_lists(n);
        (Arc::clone(&backend), memory, LockClient::new(backend))
    }

    /// A grant whose size check could not be read is not a permit: a try
    /// reports the error and leaves the slot free.
    #[tokio::test(start_paused = true)]
    async fn an_unchecked_grant_is_given_back_by_a_try() {
        let (_, memory, client) = failing(1);
        let r = client.semaphore("s", 1).try_acquire().await;
        assert!(matches!(&r, Err(e) if e.is_transient()), "{r:?}");
        let slot0 = LockKey::new(semaphore_slot_key("s", 0)).unwrap();
        assert_eq!(memory.inspect(&slot0).await.unwrap(), None);
    }

    /// A waiting acquisition whose check fails gives the grant back and
    /// tries again, checking the next grant too.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_acquisition_checks_again() {
        let (backend, memory, client) = failing(2);
        let permit = client
            .semaphore("s", 1)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        assert_eq!(backend.list_calls(), 3);
        let slot0 = LockKey::new(semaphore_slot_key("s", 0)).unwrap();
        let held = memory.inspect(&slot0).await.unwrap().unwrap();
        assert_eq!(held.token, permit.token());
        permit.release().await.unwrap();
    }

    /// The check reads only this semaphore's slots: a permit of another
    /// size in a semaphore whose name extends this one's, or a plain lock
    /// on a slot-like key of another spelling, is no mismatch.
    #[tokio::test]
    async fn other_semaphores_and_spellings_are_not_mismatches() {
        let (_, _, client) = failing(0);
        let sub = client.semaphore("s/1", 3).acquire().await.unwrap();
        let spelled = client
            .lock(format!("{SEMAPHORE_PREFIX}s/01"))
            .data(json!({ META: { "permits": 5 } }))
            .acquire()
            .await
            .unwrap();
        let permit = client.semaphore("s", 1).try_acquire().await.unwrap();
        assert!(permit.is_some());
        sub.release().await.unwrap();
        spelled.release().await.unwrap();
    }
}
