//! All-or-nothing locks on several keys (`docs/multi-key.md`).
//!
//! Where the backend claims [`crate::Capabilities::atomic_multi`], every key
//! is taken in one atomic step ([`Backend::try_acquire_all`]), retried as a
//! whole while some key is held. Elsewhere keys are taken one after another
//! in sorted order: two callers whose key sets overlap meet on their lowest
//! common key first, so one of them waits there while holding nothing the
//! other needs, and neither can deadlock the other, whatever order their
//! callers listed the keys in. The atomic step gets its keys in the same
//! sorted order, for the same reason inside the engine (row locks).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    future::Future,
    time::Duration,
};

use futures_util::future::{join_all, select_all};
use serde_json::Value;
use tokio::time::Instant;

use crate::{
    backend::{AcquireAll, AcquireRequest, Backend},
    backoff::Backoff,
    client::{LockClient, LockRequest, WAIT_BACKOFF},
    clock::Sent,
    error::{BackendError, Error, ErrorStatus, LossReason, Result},
    guard::LockGuard,
    lease::GuardConfig,
    metrics as m,
    types::{FencingToken, LockKey, Owner},
    wake::WakeSubscription,
};

impl LockClient {
    /// Starts building an acquisition of every key in `keys`, all or
    /// nothing. Keys are sorted and de-duplicated; an empty list is
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use fencelock_core::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let client = LockClient::new(Arc::new(MemoryBackend::new()));
    /// let all = client.lock_all(["account:2", "account:1"]).acquire().await?;
    /// assert_eq!(all.keys()[0].as_str(), "account:1");
    /// let token = all.token("account:2").expect("held");
    /// assert!(token.get() > 0);
    /// all.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLockRequest<'_>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLockRequest {
            keys: keys.into_iter().map(Into::into).collect(),
            parts: self.lock(String::new()),
            floors: BTreeMap::new(),
        }
    }
}

/// An all-or-nothing acquisition being built:
/// `client.lock_all(keys).ttl(..).wait(..).acquire()`.
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct MultiLockRequest<'a> {
    keys: BTreeSet<String>,
    /// The options every part is taken with (its key is not used).
    parts: LockRequest<'a>,
    /// Token floors of some parts, by key.
    floors: BTreeMap<String, FencingToken>,
}

impl MultiLockRequest<'_> {
    /// Lease length of every part.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.parts = self.parts.ttl(ttl);
        self
    }

    /// How long the whole call may wait (default: not at all): one deadline
    /// shared by every key, not a wait per key.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.parts = self.parts.wait(wait);
        self
    }

    /// A label stored with every part's lease.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.parts = self.parts.kind(kind);
        self
    }

    /// JSON metadata stored with every part's lease.
    pub fn data(mut self, data: Value) -> Self {
        self.parts = self.parts.data(data);
        self
    }

    /// Renewal period of every part (default: a third of the TTL).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.parts = self.parts.renew_every(period);
        self
    }

    /// Holder of every part (default: the client's owner), as
    /// [`LockRequest::owner`].
    pub fn owner(mut self, owner: Owner) -> Self {
        self.parts = self.parts.owner(owner);
        self
    }

    /// Whether the parts are renewed in the background (default `true`),
    /// as [`LockRequest::auto_renew`]: off for a holder that renews by
    /// itself, such as the client of a lock service.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.parts = self.parts.auto_renew(on);
        self
    }

    /// A floor for the token of `key`'s part, as [`LockRequest::min_token`]
    /// (on backends that support one); the other parts keep their own.
    pub fn min_token_of(mut self, key: impl Into<String>, floor: FencingToken) -> Self {
        self.floors.insert(key.into(), floor);
        self
    }

    /// Lock delay of every part (see [`LockRequest::hold_at_least`]).
    pub fn hold_at_least(mut self, delay: Duration) -> Self {
        self.parts = self.parts.hold_at_least(delay);
        self
    }

    /// The request for one part, waiting at most `wait`.
    fn part(&self, key: &str, wait: Duration) -> LockRequest<'_> {
        let part = self.parts.for_key(key.to_owned()).wait(wait);
        match self.floors.get(key) {
            Some(&floor) => part.min_token(floor),
            None => part,
        }
    }

    /// Takes every key: in one atomic step where the backend claims
    /// [`crate::Capabilities::atomic_multi`] (retried as a whole until the
    /// deadline), else in sorted order, each waiting within what is left of
    /// the one deadline. On any failure nothing stays held (the sequential
    /// path releases the parts it took before the error returns):
    /// [`Error::Timeout`] (naming the key that was held elsewhere, and the
    /// whole wait) or the backend's own error.
    pub async fn acquire(self) -> Result<MultiGuard> {
        if self.keys.is_empty() {
            return Err(Error::InvalidArgument(
                "lock_all needs at least one key".into(),
            ));
        }
        if let Some(stray) = self.floors.keys().find(|k| !self.keys.contains(*k)) {
            return Err(Error::InvalidArgument(format!(
                "a token floor for {stray:?}, which is not one of the keys"
            )));
        }
        // Every key and option is checked before anything is taken.
        let mut requests = Vec::with_capacity(self.keys.len());
        let mut config = None;
        for key in &self.keys {
            let (request, part_config) = self.part(key, Duration::ZERO).validate()?;
            requests.push(request);
            config = Some(part_config);
        }
        let deadline = Instant::now().checked_add(self.parts.wait);
        let inner = &self.parts.client.inner;
        if let Some(config) = config.filter(|_| inner.backend.capabilities().atomic_multi) {
            if inner.renewer.is_closed() {
                return Err(Error::ClientClosed);
            }
            match self.acquire_atomic(&requests, config, deadline).await {
                // This set cannot be taken atomically here (Redis Cluster
                // keys in several hash slots): one by one instead.
                Err(Error::Unsupported(why)) => {
                    tracing::debug!(%why, "taking the keys one by one");
                }
                other => return other,
            }
        }
        let mut guards: Vec<LockGuard> = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match self.part(key, left).acquire().await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    release_parts(guards).await;
                    return Err(match e {
                        Error::Timeout { key, .. } => Error::Timeout {
                            key,
                            waited: self.parts.wait,
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// The atomic path: one [`Backend::try_acquire_all`] per attempt, until
    /// every key is granted or the deadline passes. A key found held is
    /// waited for with its wake-ups where the backend has them (subscribed
    /// before the next attempt, so a release in between is not missed), else
    /// with jittered backoff never longer than its holder's lease.
    async fn acquire_atomic(
        &self,
        requests: &[AcquireRequest],
        config: GuardConfig,
        deadline: Option<Instant>,
    ) -> Result<MultiGuard> {
        let client = &self.parts.client.inner;
        let backend = &client.backend;
        let name = backend.name();
        let wait = self.parts.wait;
        let started = Instant::now();
        let before_deadline = |now: Instant| deadline.is_none_or(|d| now < d);
        let mut backoff = Backoff::new(WAIT_BACKOFF.0, WAIT_BACKOFF.1);
        // The key whose wake-ups we listen to, and the subscription.
        let mut watching: Option<usize> = None;
        let mut wakeups: Option<WakeSubscription> = None;
        loop {
            ::metrics::counter!(m::ACQUIRE_ATTEMPTS, "backend" => name).increment(1);
            let sent = Sent::now();
            let answer =
                tokio::time::timeout(client.op_timeout, backend.try_acquire_all(requests)).await;
            let held = match answer {
                Ok(Ok(AcquireAll::Granted(grants))) if grants.len() != requests.len() => {
                    // What was granted cannot be told apart: give back what
                    // pairs up, the rest ends by expiry.
                    give_back(backend.as_ref(), requests, &grants, client.op_timeout).await;
                    return Err(BackendError::message(
                        name,
                        ErrorStatus::Permanent,
                        format!(
                            "{} grants for {} keys: a broken atomic acquisition",
                            grants.len(),
                            requests.len()
                        ),
                    )
                    .into());
                }
                Ok(Ok(AcquireAll::Granted(grants))) => {
                    let shortest = grants.iter().map(|g| g.ttl).min().unwrap_or_default();
                    if Instant::now() < sent.mono + config.clock.valid_for(shortest) {
                        ::metrics::counter!(m::ACQUIRE_SUCCESSES, "backend" => name).increment(1);
                        ::metrics::histogram!(m::WAIT_SECONDS, "backend" => name)
                            .record(started.elapsed().as_secs_f64());
                        let guards = requests
                            .iter()
                            .zip(grants)
                            .map(|(request, grant)| {
                                LockGuard::start(
                                    backend.clone(),
                                    &client.renewer,
                                    request.clone(),
                                    grant,
                                    sent,
                                    config,
                                )
                            })
                            .collect();
                        return Ok(MultiGuard { guards });
                    }
                    // Answered after the guards would have stopped trusting
                    // the leases (I5): hand them back, count a failed try.
                    give_back(backend.as_ref(), requests, &grants, client.op_timeout).await;
                    if !before_deadline(Instant::now()) {
                        return Err(BackendError::message(
                            name,
                            ErrorStatus::Transient,
                            format!(
                                "the grants arrived after their {shortest:?} leases had ended \
                                 locally (round trip {:?}); use a longer TTL",
                                sent.mono.elapsed()
                            ),
                        )
                        .into());
                    }
                    None
                }
                Ok(Ok(AcquireAll::Held { index, holder })) => Some((index, holder)),
                Ok(Err(e)) if e.is_transient() && before_deadline(Instant::now()) => {
                    tracing::debug!(error = %e, "transient error while acquiring; retrying");
                    None
                }
                Ok(Err(e)) => return Err(e),
                Err(_elapsed) if before_deadline(Instant::now()) => None,
                Err(_elapsed) => {
                    return Err(Error::OperationTimeout {
                        operation: "acquire",
                        after: client.op_timeout,
                    })
                }
            };
            let now = Instant::now();
            if !before_deadline(now) {
                if !wait.is_zero() {
                    ::metrics::counter!(m::ACQUIRE_TIMEOUTS, "backend" => name).increment(1);
                }
                let index = held.as_ref().map_or(0, |(i, _)| *i);
                let key = requests
                    .get(index)
                    .or(requests.first())
                    .map(|r| r.key.clone());
                return match key {
                    Some(key) => Err(Error::Timeout { key, waited: wait }),
                    None => Err(Error::InvalidArgument(
                        "lock_all needs at least one key".into(),
                    )),
                };
            }
            if let Some((index, _)) = &held {
                if watching != Some(*index) && backend.capabilities().wakeups {
                    watching = Some(*index);
                    wakeups = None;
                    if let Some(request) = requests.get(*index) {
                        let left = deadline.map_or(client.op_timeout, |d| d - now);
                        let subscribe = backend.subscribe(&request.key);
                        if let Ok(Ok(Some(sub))) =
                            tokio::time::timeout(client.op_timeout.min(left), subscribe).await
                        {
                            wakeups = Some(sub);
                            // Released between the attempt and the
                            // subscription? Only another attempt can tell.
                            continue;
                        }
                    }
                }
            }
            let mut pause = backoff.next_pause();
            if let Some(deadline) = deadline {
                pause = pause.min(deadline - now);
            }
            if let Some((_, Some(holder))) = &held {
                pause = pause.min(holder.expires_in + Duration::from_millis(1));
            }
            match wakeups.as_mut() {
                Some(sub) => {
                    tokio::select! {
                        alive = sub.woken() => if alive {
                            backoff.reset();
                        } else {
                            wakeups = None;
                        },
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                None => tokio::time::sleep(pause).await,
            }
        }
    }

    /// One attempt at every key, no waiting: `Ok(None)` when some key is
    /// held elsewhere (and nothing stays held).
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Releases the leases of an atomic grant that came back too late to be
/// trusted; a lease whose release fails ends by expiry.
async fn give_back(
    backend: &dyn Backend,
    requests: &[AcquireRequest],
    grants: &[crate::Grant],
    timeout: Duration,
) {
    tracing::warn!(
        keys = requests.len(),
        "grants arrived after their leases had ended locally; releasing them"
    );
    let releases = requests
        .iter()
        .zip(grants)
        .map(|(request, grant)| async move {
            let lease = request.lease(grant.token);
            let release = backend.release(&lease);
            if !matches!(tokio::time::timeout(timeout, release).await, Ok(Ok(()))) {
                tracing::debug!(key = %lease.key, "could not release a late grant; it will expire");
            }
        });
    join_all(releases).await;
}

/// Gives back the parts of a failed acquisition, all at once; a part whose
/// release fails ends by expiry.
async fn release_parts(guards: Vec<LockGuard>) {
    for result in join_all(guards.into_iter().map(LockGuard::release)).await {
        if let Err(e) = result {
            tracing::debug!(error = %e, "could not release a part; it will expire");
        }
    }
}

/// Several held locks, valid only while every one of them is.
///
/// Dropping it releases every part in the background, like a guard.
#[must_use = "dropping a guard releases the locks"]
pub struct MultiGuard {
    /// Sorted by key.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The keys, sorted.
    pub fn keys(&self) -> Vec<LockKey> {
        self.guards.iter().map(|g| g.key().clone()).collect()
    }

    /// Each key's fencing token, sorted by key: fence each key's resource
    /// with its own token.
    pub fn tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.key().clone(), g.token()))
            .collect()
    }

    /// The token of `key`, if it is one of this guard's keys.
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.key().as_str() == key)
            .map(|g| g.token())
    }

    /// The guard of each part, sorted by key.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every part is still trusted.
    pub fn is_valid(&self) -> bool {
        self.guards.iter().all(|g| g.is_valid())
    }

    /// `Ok` while every part is trusted; the first part's
    /// [`Error::LockLost`] otherwise.
    pub fn check(&self) -> Result<()> {
        self.guards.iter().try_for_each(|g| g.check())
    }

    /// How long every part is still trusted (the least of them).
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|g| g.remaining())
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Completes when ANY part is lost, with that part's key and reason.
    pub fn lost(&self) -> impl Future<Output = (LockKey, LossReason)> + Send + 'static {
        let parts: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let key = g.key().clone();
                let lost = g.lost();
                Box::pin(async move { (key, lost.await) })
            })
            .collect();
        async move {
            if parts.is_empty() {
                // Never the case (`acquire` refuses an empty list); a guard
                // of nothing is never lost.
                return std::future::pending().await;
            }
            select_all(parts).await.0
        }
    }

    /// Stops renewing and hands every part over without releasing it, as
    /// [`LockGuard::detach`] does for one lock. Read [`tokens`](Self::tokens)
    /// first.
    pub fn detach(self) {
        for guard in self.guards {
            guard.detach();
        }
    }

    /// Stops renewal and releases every part now, concurrently. The first
    /// failure is returned after all have been tried.
    pub async fn release(self) -> Result<()> {
        let results = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("parts", &self.guards)
            .finish()
    }
}
