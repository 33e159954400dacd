//! Leader election on top of the lock: the leader is the holder of the key
//! `fencelock/election/<name>`, its term is the lease's fencing token, and
//! its leadership is a [`LockGuard`] (renewed by the client's one renewer,
//! lost before the lease ends, I5). See `docs/election.md`.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures_util::Stream;
use serde::Serialize;

use crate::{
    client::{validate_data, LockClient, LockRequest},
    deadline::bounded,
    error::{Error, LossReason, Result},
    guard::{GuardHandle, LockGuard},
    types::{FencingToken, LockInfo, LockKey, Owner},
    watch::{HolderChange, Watch},
};

/// The prefix of every election's key. Keys under `fencelock/` are used by
/// fencelock's own primitives; applications should not lock them directly.
pub const ELECTION_PREFIX: &str = "fencelock/election/";

/// A leader election: `client.election("scheduler")`.
///
/// Candidates [`campaign`](Election::campaign) (waiting as standbys until
/// the key is free), observers read [`leader`](Election::leader) or follow
/// [`observe`](Election::observe).
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use fencelock_core::{LockClient, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock_core::Error> {
/// let client = LockClient::new(Arc::new(MemoryBackend::new()));
/// let election = client
///     .election("scheduler")
///     .ttl(Duration::from_secs(10))
///     .value(serde_json::json!({"addr": "10.0.0.7:8080"}));
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("we lead");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "an election does nothing until campaigned or observed"]
pub struct Election {
    client: LockClient,
    name: String,
    ttl: Option<Duration>,
    value: Option<serde_json::Value>,
    renew_every: Option<Duration>,
    wait: Option<Duration>,
}

impl LockClient {
    /// The leader election `name` on this client's backend (see
    /// [`Election`]).
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.clone(), name.into())
    }
}

impl Election {
    pub(crate) fn new(client: LockClient, name: String) -> Self {
        Self {
            client,
            name,
            ttl: None,
            value: None,
            renew_every: None,
            wait: None,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key the leader holds: `fencelock/election/<name>`.
    pub fn key(&self) -> String {
        format!("{ELECTION_PREFIX}{}", self.name)
    }

    /// The leader's lease length (default: the client's TTL). A crashed
    /// leader is replaced at most this long after its last renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The value a leader publishes when elected (its address, say); it can
    /// change it later with [`Leadership::proclaim`].
    pub fn value(mut self, value: serde_json::Value) -> Self {
        self.value = Some(value);
        self
    }

    /// Renewal period of the leader's lease (default: a third of the TTL).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.renew_every = Some(period);
        self
    }

    /// How long [`campaign`](Election::campaign) waits as a standby before
    /// [`Error::Timeout`] (default: forever).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The key, refusing an empty name (which would name the prefix itself)
    /// and names that make an invalid key.
    fn checked_key(&self) -> Result<String> {
        if self.name.is_empty() {
            return Err(Error::InvalidArgument(
                "an election's name must not be empty".into(),
            ));
        }
        let key = self.key();
        LockKey::new(key.as_str())?;
        Ok(key)
    }

    fn request(&self, wait: Duration) -> LockRequest<'_> {
        let mut request = self.client.lock(self.key()).wait(wait);
        if let Some(ttl) = self.ttl {
            request = request.ttl(ttl);
        }
        if let Some(value) = &self.value {
            request = request.data(value.clone());
        }
        if let Some(period) = self.renew_every {
            request = request.renew_every(period);
        }
        request
    }

    /// Waits as a standby until this candidate is elected (for the
    /// [`wait`](Election::wait) set, forever by default). Waiting uses the
    /// backend's release wake-ups where it has them, and otherwise backs
    /// off, never past the current leader's lease.
    pub async fn campaign(&self) -> Result<Leadership> {
        self.campaign_for(self.wait.unwrap_or(Duration::MAX)).await
    }

    /// [`campaign`](Election::campaign) waiting at most `wait`;
    /// [`Error::Timeout`] after it.
    pub async fn campaign_for(&self, wait: Duration) -> Result<Leadership> {
        self.checked_key()?;
        let guard = self.request(wait).acquire().await?;
        Ok(Leadership {
            guard,
            client: self.client.clone(),
        })
    }

    /// The current leader, if any.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let key = self.checked_key()?;
        Ok(self.client.inspect(&key).await?.map(Leader::from))
    }

    /// The current leader (if any, first) and every change from now on:
    /// elections, and vacancies by resignation or by expiry of the leader's
    /// lease. Uses the backend's watch where it has one and polls
    /// otherwise (see [`LockClient::watch`]).
    pub async fn observe(&self) -> Result<LeaderWatch> {
        let key = LockKey::new(self.checked_key()?)?;
        // The read is shown first; the watch reports every change after it
        // (with a backend's own watch, also some before it, which the
        // read's term tells apart).
        let (current, changes) = self.client.read_and_watch(&key).await?;
        let current = current.map(Leader::from);
        Ok(LeaderWatch {
            floor: current.as_ref().map(|l| l.term),
            current,
            changes,
        })
    }

    /// Campaigns, runs `work` while leader, and campaigns again whenever the
    /// leadership is lost (the work's future is dropped at its next await
    /// point, before the lease can end on the backend). When the work
    /// finishes while still leader, resigns and returns its value.
    ///
    /// Ends with [`Error::LockLost`] if the client is closed while leading,
    /// and with the campaign's error (a [`Error::Timeout`] after
    /// [`wait`](Election::wait)) otherwise.
    pub async fn run<F, Fut, T>(&self, mut work: F) -> Result<T>
    where
        F: FnMut(GuardHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let leadership = self.campaign().await?;
            let running = work(leadership.handle());
            tokio::pin!(running);
            tokio::select! {
                biased;
                reason = leadership.lost() => {
                    if reason == LossReason::Closed {
                        return Err(Error::LockLost {
                            key: leadership.guard.key().clone(),
                            token: leadership.term(),
                            reason,
                        });
                    }
                    tracing::info!(
                        election = %self.name, term = %leadership.term(), %reason,
                        "leadership lost; campaigning again"
                    );
                }
                value = &mut running => {
                    leadership.check()?;
                    if let Err(e) = leadership.resign().await {
                        tracing::warn!(error = %e, "resigning failed; the lease will expire");
                    }
                    return Ok(value);
                }
            }
        }
    }
}

/// Being the leader: a [`LockGuard`] on the election's key.
///
/// Dropping it resigns in the background, like dropping a guard.
#[derive(Debug)]
#[must_use = "dropping a leadership resigns it"]
pub struct Leadership {
    guard: LockGuard,
    client: LockClient,
}

impl Leadership {
    /// The term: the lease's fencing token, greater than every earlier
    /// leader's. Present it to fences so that a deposed leader's writes are
    /// refused.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// Publishes `value` as the leader's value, if still leader
    /// ([`Error::NotHeld`] otherwise). Needs a backend that claims
    /// [`crate::Capabilities::set_data`].
    pub async fn proclaim(&self, value: serde_json::Value) -> Result<()> {
        validate_data(&value)?;
        let backend = self.client.backend();
        if !backend.capabilities().set_data {
            return Err(Error::unsupported(backend.name(), "set_data"));
        }
        self.guard.check()?;
        bounded(
            self.client.op_timeout(),
            "set_data",
            backend.set_data(self.guard.lease(), Some(value)),
        )
        .await
    }

    /// Steps down now, so that a standby is elected at once.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// Completes when the leadership is lost (before the lease ends on the
    /// backend), with the reason.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.guard.lost()
    }

    /// Whether this candidate still trusts its leadership.
    pub fn is_valid(&self) -> bool {
        self.guard.is_valid()
    }

    /// `Ok` while leader, [`Error::LockLost`] after; call before each act
    /// of leadership.
    pub fn check(&self) -> Result<()> {
        self.guard.check()
    }

    /// A cloneable handle to the leader's guard (token, key, loss signal).
    pub fn handle(&self) -> GuardHandle {
        self.guard.handle()
    }

    /// The election's key.
    pub fn key(&self) -> &LockKey {
        self.guard.key()
    }

    /// The leader's guard, for code that supervises work under any lock
    /// (`fencelock elect` hands it to the same supervision as `run`).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

/// Who leads an election, as the backend reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's owner name.
    pub owner: Owner,
    /// The value it published, if any.
    pub value: Option<serde_json::Value>,
    /// Its term (the lease's fencing token).
    pub term: FencingToken,
    /// Time left on its lease, on the backend's clock, when read.
    #[serde(rename = "expires_in_ms", serialize_with = "millis")]
    pub expires_in: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl From<LockInfo> for Leader {
    fn from(info: LockInfo) -> Self {
        Self {
            owner: info.owner,
            value: info.data,
            term: info.token,
            expires_in: info.expires_in,
        }
    }
}

/// A change of an election's leader.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum LeaderChange {
    /// A leader was elected (or was leading when observation began).
    Elected(Leader),
    /// The leader of `previous_term` is gone: it resigned (`expired:
    /// false`) or its lease ran out (`expired: true`, a crashed or cut-off
    /// leader).
    Vacant {
        /// The term that ended.
        previous_term: FencingToken,
        /// Whether the lease expired rather than being released.
        expired: bool,
    },
}

/// The stream of [`LeaderChange`]s from [`Election::observe`]. Dropping it
/// stops the observation.
#[derive(Debug)]
pub struct LeaderWatch {
    current: Option<Leader>,
    /// The term read when observation began: the watch's reports of older
    /// terms happened before it and are skipped.
    floor: Option<FencingToken>,
    changes: Watch,
}

impl LeaderWatch {
    /// The next change; `None` when the backend's watch ended.
    pub async fn next(&mut self) -> Option<Result<LeaderChange>> {
        futures_util::StreamExt::next(self).await
    }
}

impl Stream for LeaderWatch {
    type Item = Result<LeaderChange>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(leader) = self.current.take() {
            return Poll::Ready(Some(Ok(LeaderChange::Elected(leader))));
        }
        loop {
            let change = match Pin::new(&mut self.changes).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(change))) => change,
            };
            let floor = self.floor;
            let change = match change {
                HolderChange::Acquired(info) if floor.is_some_and(|f| info.token <= f) => continue,
                HolderChange::Acquired(info) => LeaderChange::Elected(Leader::from(info)),
                HolderChange::Released(lease) | HolderChange::Expired(lease)
                    if floor.is_some_and(|f| lease.token < f) =>
                {
                    continue
                }
                HolderChange::Released(lease) => LeaderChange::Vacant {
                    previous_term: lease.token,
                    expired: false,
                },
                HolderChange::Expired(lease) => LeaderChange::Vacant {
                    previous_term: lease.token,
                    expired: true,
                },
            };
            return Poll::Ready(Some(Ok(change)));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use std::sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    };

    use super::*;
    use crate::{Fence, MemoryBackend, MemoryFence};

    fn client(backend: &MemoryBackend, name: &str) -> LockClient {
        LockClient::builder(Arc::new(backend.clone()))
            .owner(Owner::new(name).unwrap())
            .build()
            .unwrap()
    }

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test]
    async fn bad_names_are_typed_errors() {
        let c = client(&MemoryBackend::new(), "a");
        assert!(matches!(
            c.election("").campaign().await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.election("tab\there").leader().await,
            Err(Error::InvalidKey(_))
        ));
        assert!(matches!(
            c.election("x".repeat(250)).observe().await,
            Err(Error::InvalidKey(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_over_after_resignation_and_after_a_crash() {
        let backend = MemoryBackend::new();
        let (a, b) = (client(&backend, "a"), client(&backend, "b"));
        let first = a.election("e").ttl(TTL).campaign().await.unwrap();
        let standby = tokio::spawn({
            let b = b.clone();
            async move { b.election("e").ttl(TTL).campaign().await }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!standby.is_finished(), "two leaders at once");
        let term = first.term();
        first.resign().await.unwrap();
        let second = standby.await.unwrap().unwrap();
        assert!(second.term() > term);

        // A crash: the leader stops renewing without resigning.
        let second_term = second.term();
        let started = tokio::time::Instant::now();
        let Leadership { guard, .. } = second;
        guard.detach();
        let third = a.election("e").ttl(TTL).campaign().await.unwrap();
        assert!(third.term() > second_term);
        assert!(
            started.elapsed() >= TTL,
            "taken over before the lease ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn campaign_for_times_out_and_observe_sees_election_and_vacancies() {
        let backend = MemoryBackend::new();
        let (a, b) = (client(&backend, "a"), client(&backend, "b"));
        let election = a.election("obs").ttl(TTL);
        let mut changes = b.election("obs").observe().await.unwrap();
        let leader = election
            .clone()
            .value(serde_json::json!("a:1"))
            .campaign()
            .await
            .unwrap();
        match changes.next().await.unwrap().unwrap() {
            LeaderChange::Elected(l) => {
                assert_eq!(l.term, leader.term());
                assert_eq!(l.value, Some(serde_json::json!("a:1")));
                assert_eq!(l.owner.as_str(), "a");
            }
            other => panic!("{other:?}"),
        }
        let refused = b.election("obs").campaign_for(Duration::from_secs(1)).await;
        assert!(matches!(refused, Err(Error::Timeout { .. })), "{refused:?}");
        leader
            .proclaim(serde_json::json!({"addr": "a:2"}))
            .await
            .unwrap();
        let now = b.election("obs").leader().await.unwrap().unwrap();
        assert_eq!(now.value, Some(serde_json::json!({"addr": "a:2"})));
        assert_eq!(now.term, leader.term());
        let term = leader.term();
        leader.resign().await.unwrap();
        assert_eq!(
            changes.next().await.unwrap().unwrap(),
            LeaderChange::Vacant {
                previous_term: term,
                expired: false
            }
        );
        let crashed = election.campaign().await.unwrap();
        let crashed_term = crashed.term();
        assert!(matches!(
            changes.next().await.unwrap().unwrap(),
            LeaderChange::Elected(ref l) if l.term == crashed_term
        ));
        crashed.guard.detach();
        assert_eq!(
            changes.next().await.unwrap().unwrap(),
            LeaderChange::Vacant {
                previous_term: crashed_term,
                expired: true
            }
        );
        // A new observer is told the current leader first.
        let again = election.campaign().await.unwrap();
        let mut late = b.election("obs").observe().await.unwrap();
        assert!(matches!(
            late.next().await.unwrap().unwrap(),
            LeaderChange::Elected(ref l) if l.term == again.term()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn run_restarts_the_work_after_a_loss_and_the_fence_refuses_the_deposed_term() {
        let backend = MemoryBackend::new();
        let (a, op) = (client(&backend, "a"), client(&backend, "operator"));
        let fence = MemoryFence::new();
        let starts = Arc::new(AtomicU32::new(0));
        let election = a.election("runner").ttl(TTL);
        let runner = tokio::spawn({
            let (election, fence, starts) = (election.clone(), fence.clone(), starts.clone());
            async move {
                election
                    .run(|handle| {
                        let (fence, starts) = (fence.clone(), starts.clone());
                        async move {
                            let n = starts.fetch_add(1, Ordering::SeqCst);
                            fence.admit("resource", handle.token()).await.unwrap();
                            if n == 0 {
                                // The first term never ends by itself.
                                std::future::pending::<()>().await;
                            }
                            handle.token()
                        }
                    })
                    .await
            }
        });
        while starts.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let first = a.election("runner").leader().await.unwrap().unwrap().term;
        // Deposed by an operator: the renewer's next renewal is refused.
        op.force_release(&election.key()).await.unwrap();
        let second = runner.await.unwrap().unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        assert!(second > first);
        assert!(matches!(
            fence.admit("resource", first).await,
            Err(Error::Stale { .. })
        ));
        assert!(op.inspect(&election.key()).await.unwrap().is_none());
    }
}
