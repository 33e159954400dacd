//! `LockGuard`: a held lease, its renewal watchdog and its loss signal.
//!
//! Each guard owns one background task, the *watchdog*. It renews the lease
//! every `renew_every` and, whether or not it renews, fires the loss signal
//! when the conservative local deadline (I5) passes without a confirmed
//! renewal. The deadline is computed from the instant *before* each request
//! was sent, so the signal fires before the backend's lease can end.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    backend::{AcquireRequest, Backend, Grant},
    backoff::Backoff,
    client::ClockPolicy,
    clock::{boot_time, suspends, Sent},
    error::{BackendError, Error, LossReason, Result},
    metrics as m,
    types::{FencingToken, LockKey, Owner},
};

/// Settings a guard takes from its request and client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GuardConfig {
    pub(crate) renew_every: Option<Duration>,
    pub(crate) clock: ClockPolicy,
    pub(crate) op_timeout: Duration,
}

struct Shared {
    backend: Arc<dyn Backend>,
    key: LockKey,
    owner: Owner,
    token: FencingToken,
    ttl: Duration,
    clock: ClockPolicy,
    op_timeout: Duration,
    granted_at: Instant,
    /// Latest instant until which the lease is trusted locally.
    deadline: Mutex<Instant>,
    /// The same limit on the boot-time clock, which keeps counting while the
    /// machine is suspended (see `clock.rs`).
    boot_deadline: Mutex<Option<Duration>>,
    /// The TTL the backend last granted (etcd may round up).
    granted_ttl: Mutex<Duration>,
    /// Whether the hold has been recorded in the metrics (on loss or finish,
    /// whichever comes first).
    accounted: std::sync::atomic::AtomicBool,
    /// Backend-reported end of the lease, for display.
    expires_at: Mutex<DateTime<Utc>>,
    /// Cancelled once, when the lock is lost.
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    /// Set when the guard is released or dropped: stops the watchdog.
    stop: Stop,
}

/// A one-shot stop signal held inline (a `CancellationToken` would be one
/// more allocation per held lock).
#[derive(Default)]
struct Stop {
    stopped: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Stop {
    fn cancel(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_cancelled(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read, so a cancel in between
            // is not missed.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

impl Shared {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the boot-time clock is still inside the trusted window.
    fn boot_ok(&self) -> bool {
        let limit = *self
            .boot_deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match (limit, boot_time()) {
            (Some(limit), Some(now)) => now < limit,
            _ => true,
        }
    }

    /// Records a confirmed grant/renewal whose request left at `sent`.
    fn extend(&self, sent: Sent, grant: &Grant) {
        let valid_for = self.clock.valid_for(grant.ttl);
        let trusted_until = sent.mono + valid_for;
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        if trusted_until > *deadline {
            *deadline = trusted_until;
            *self
                .boot_deadline
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = sent.boot.map(|b| b + valid_for);
        }
        *self
            .granted_ttl
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = grant.ttl;
        *self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = grant.expires_at;
    }

    /// Records the hold once: at loss, release, drop or detach.
    fn account_hold(&self) {
        if self
            .accounted
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let backend = self.backend.name();
        ::metrics::gauge!(m::HELD, "backend" => backend).decrement(1.0);
        ::metrics::histogram!(m::HOLD_SECONDS, "backend" => backend)
            .record(self.granted_at.elapsed().as_secs_f64());
    }

    fn declare_lost(&self, reason: LossReason) {
        if self.stop.is_cancelled() || self.reason.set(reason).is_err() {
            return;
        }
        let backend = self.backend.name();
        ::metrics::counter!(m::LOCKS_LOST, "backend" => backend, "reason" => reason.as_str())
            .increment(1);
        tracing::warn!(
            key = %self.key, owner = %self.owner, token = %self.token, backend,
            reason = reason.as_str(), "lock lost: {reason}"
        );
        self.account_hold();
        self.lost.cancel();
    }

    fn lost_error(&self) -> Error {
        Error::LockLost {
            key: self.key.clone(),
            token: self.token,
            reason: self.reason.get().copied().unwrap_or(LossReason::Deadline),
        }
    }

    fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.deadline() && self.boot_ok()
    }

    /// One renewal round trip, bounded so that a hung connection costs one
    /// attempt, not the whole remaining lease.
    async fn renew_once(&self) -> Result<Grant> {
        let bound = self
            .op_timeout
            .min(self.ttl / 3)
            .max(Duration::from_millis(1));
        let renew = self
            .backend
            .renew(&self.key, &self.owner, self.token, self.ttl);
        match tokio::time::timeout(bound, renew).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::message(
                self.backend.name(),
                true,
                format!("renewal did not answer within {bound:?}"),
            )
            .into()),
        }
    }
}

/// A cheap, cloneable view of a held lock: what `with_lock` closures get, and
/// what a [`LockGuard`] dereferences to.
#[derive(Clone)]
pub struct GuardHandle {
    shared: Arc<Shared>,
}

impl GuardHandle {
    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.shared.key
    }

    /// The owner the lock is held as.
    pub fn owner(&self) -> &Owner {
        &self.shared.owner
    }

    /// The fencing token of this grant: present it to every fenced resource.
    pub fn token(&self) -> FencingToken {
        self.shared.token
    }

    /// The requested lease length.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The lease length the backend last granted; longer than
    /// [`ttl`](Self::ttl) where the backend rounds up (etcd).
    pub fn granted_ttl(&self) -> Duration {
        *self
            .shared
            .granted_ttl
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// End of the lease as the backend last reported it (backend clock; for
    /// display, not for decisions — use [`remaining`](Self::remaining)).
    pub fn expires_at(&self) -> DateTime<Utc> {
        *self
            .shared
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the lease is still trusted locally: not lost, and the local
    /// deadline has not passed.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// How long the lease is still trusted locally (zero once lost).
    pub fn remaining(&self) -> Duration {
        if !self.shared.is_valid() {
            return Duration::ZERO;
        }
        self.shared
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// `Ok` while the lease is trusted; [`Error::LockLost`] otherwise. Call it
    /// right before each critical write (and fence the write: a check cannot
    /// stop a process that pauses between the check and the write).
    pub fn check(&self) -> Result<()> {
        if self.is_valid() {
            Ok(())
        } else {
            if !self.shared.lost.is_cancelled() {
                // The deadline passed before the watchdog noticed.
                self.shared.declare_lost(LossReason::Deadline);
            }
            Err(self.shared.lost_error())
        }
    }

    /// Why the lock was lost, once it has been.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.reason.get().copied()
    }

    /// Completes when the lock is lost, before the backend's lease ends.
    /// Never completes for a lock that is released or dropped normally.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move {
            shared.lost.cancelled().await;
            shared.reason.get().copied().unwrap_or(LossReason::Deadline)
        }
    }

    /// A token cancelled when the lock is lost, to hand to work that should
    /// stop then. Cancelling it yourself does not affect the lock.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Renews now, in addition to the background renewal.
    /// [`Error::LockLost`] if the backend refused or the lock was lost while
    /// the renewal was in flight (the guard is then lost); a transient error
    /// if the backend did not answer in time.
    pub async fn renew(&self) -> Result<()> {
        if self.shared.lost.is_cancelled() {
            return Err(self.shared.lost_error());
        }
        let sent = Sent::now();
        match self.shared.renew_once().await {
            Ok(grant) => {
                self.shared.extend(sent, &grant);
                ::metrics::counter!(m::RENEWALS, "backend" => self.shared.backend.name())
                    .increment(1);
                // The watchdog may have given up at the deadline meanwhile;
                // a loss, once signalled, is final.
                if self.shared.lost.is_cancelled() {
                    return Err(self.shared.lost_error());
                }
                Ok(())
            }
            Err(Error::NotHeld { .. }) => {
                self.shared.declare_lost(LossReason::Refused);
                Err(self.shared.lost_error())
            }
            Err(e) => Err(e),
        }
    }
}

impl GuardHandle {
    /// What both `Debug` impls show: the grant and how long it is still
    /// trusted. Never the backend, whose URL may carry a password.
    fn debug_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("key", &self.key().as_str())
            .field("owner", &self.owner().as_str())
            .field("token", &self.token().get())
            .field("valid", &self.is_valid())
            .field("remaining", &self.remaining())
            .field("ttl", &self.ttl())
            .field("loss_reason", &self.loss_reason())
            .finish()
    }
}

impl fmt::Debug for GuardHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as("GuardHandle", f)
    }
}

/// A held lock. Dereferences to [`GuardHandle`] for `token()`, `check()`,
/// `lost()` and the rest.
///
/// Release it with [`release`](Self::release). Dropping a guard stops its
/// renewal and releases the lease **in the background**: the release is sent
/// on the current tokio runtime shortly after the drop, not before `drop`
/// returns, and not at all if the runtime is shutting down (the lease then
/// ends by expiry). Await `release()` when the next holder should not wait.
#[must_use = "dropping a guard releases the lock"]
pub struct LockGuard {
    handle: GuardHandle,
    finished: bool,
}

impl LockGuard {
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        request: AcquireRequest,
        grant: Grant,
        sent: Sent,
        config: GuardConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            backend,
            key: request.key,
            owner: request.owner,
            token: grant.token,
            ttl: request.ttl,
            clock: config.clock,
            op_timeout: config.op_timeout,
            granted_at: Instant::now(),
            deadline: Mutex::new(sent.mono),
            boot_deadline: Mutex::new(None),
            granted_ttl: Mutex::new(grant.ttl),
            accounted: std::sync::atomic::AtomicBool::new(false),
            expires_at: Mutex::new(grant.expires_at),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            stop: Stop::default(),
        });
        shared.extend(sent, &grant);
        ::metrics::gauge!(m::HELD, "backend" => shared.backend.name()).increment(1.0);
        tokio::spawn(watchdog(Arc::clone(&shared), config.renew_every));
        Self {
            handle: GuardHandle { shared },
            finished: false,
        }
    }

    /// A cloneable handle that outlives borrows of the guard.
    pub fn handle(&self) -> GuardHandle {
        self.handle.clone()
    }

    /// Stops renewal and releases the lease now.
    ///
    /// [`Error::NotHeld`] when the backend no longer had this lease (it was
    /// lost, taken over or force-released).
    pub async fn release(mut self) -> Result<()> {
        self.finish();
        let s = &self.handle.shared;
        let released =
            tokio::time::timeout(s.op_timeout, s.backend.release(&s.key, &s.owner, s.token)).await;
        match released {
            Ok(Ok(true)) => {
                tracing::debug!(key = %s.key, token = %s.token, "released");
                Ok(())
            }
            Ok(Ok(false)) => Err(Error::NotHeld {
                key: s.key.clone(),
                owner: s.owner.clone(),
                token: s.token,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BackendError::message(
                s.backend.name(),
                true,
                format!("release did not answer within {:?}", s.op_timeout),
            )
            .into()),
        }
    }

    /// Stops renewing and hands the lease over without releasing it: it stays
    /// on the backend until it expires or someone renews or releases it by
    /// (owner, token), e.g. another process (`fencelock acquire` uses this).
    /// Read [`token`](GuardHandle::token) and [`owner`](GuardHandle::owner)
    /// first.
    pub fn detach(mut self) {
        self.finish();
    }

    /// Stops the watchdog and records the hold; idempotent.
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let s = &self.handle.shared;
        s.stop.cancel();
        s.account_hold();
    }
}

impl std::ops::Deref for LockGuard {
    type Target = GuardHandle;
    fn deref(&self) -> &GuardHandle {
        &self.handle
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.handle.debug_as("LockGuard", f)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finish();
        let shared = Arc::clone(&self.handle.shared);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let release = shared
                    .backend
                    .release(&shared.key, &shared.owner, shared.token);
                match tokio::time::timeout(shared.op_timeout, release).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(key = %shared.key, error = %e,
                        "background release failed; the lease will expire"),
                    Err(_) => tracing::warn!(key = %shared.key,
                        "background release timed out; the lease will expire"),
                }
            });
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The guard's background task: renews on schedule and declares the lock
/// lost when the backend refuses or the local deadline passes.
async fn watchdog(shared: Arc<Shared>, renew_every: Option<Duration>) {
    let mut next_renewal = renew_every.map(|period| Instant::now() + period);
    loop {
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => return,
            // Monotonic timers do not run during a suspend; this notices,
            // soon after a resume, that the boot-time clock has left the
            // lease's window.
            _ = suspends().notified() => {
                if !shared.boot_ok() {
                    shared.declare_lost(LossReason::Deadline);
                    return;
                }
            }
            _ = sleep_until(shared.deadline()) => {
                // A manual renew may have moved the deadline while we slept.
                if Instant::now() >= shared.deadline() {
                    shared.declare_lost(LossReason::Deadline);
                    return;
                }
            }
            _ = sleep_until_some(next_renewal) => {
                // Boxed: the renewal's state lives only while it runs, not
                // in every idle guard's task.
                match Box::pin(renew_until_confirmed(&shared)).await {
                    Some(t_sent) => next_renewal = renew_every.map(|period| t_sent + period),
                    None => return,
                }
            }
        }
    }
}

/// Renews, retrying transient failures with backoff for as long as the lease
/// is still trusted locally. Returns the send instant of the confirmed
/// renewal, or `None` when the guard stopped or was lost.
async fn renew_until_confirmed(shared: &Shared) -> Option<Instant> {
    let backend = shared.backend.name();
    let mut backoff = Backoff::new(shared.ttl / 100, shared.ttl / 10);
    loop {
        let sent = Sent::now();
        let outcome = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => return None,
            _ = sleep_until(shared.deadline()) => None,
            result = shared.renew_once() => Some(result),
        };
        if outcome.is_some() {
            ::metrics::histogram!(m::RENEW_SECONDS, "backend" => backend)
                .record(sent.mono.elapsed().as_secs_f64());
        }
        match outcome {
            Some(Ok(grant)) => {
                shared.extend(sent, &grant);
                ::metrics::counter!(m::RENEWALS, "backend" => backend).increment(1);
                tracing::trace!(key = %shared.key, token = %shared.token, "renewed");
                return Some(sent.mono);
            }
            Some(Err(Error::NotHeld { .. })) => {
                ::metrics::counter!(m::RENEWAL_FAILURES, "backend" => backend).increment(1);
                shared.declare_lost(LossReason::Refused);
                return None;
            }
            Some(Err(e)) => {
                ::metrics::counter!(m::RENEWAL_FAILURES, "backend" => backend).increment(1);
                tracing::warn!(
                    key = %shared.key, token = %shared.token, error = %e,
                    remaining = ?shared.deadline().saturating_duration_since(Instant::now()),
                    "renewal failed; retrying while the lease is still trusted"
                );
            }
            None => {}
        }
        if Instant::now() >= shared.deadline() {
            shared.declare_lost(LossReason::Deadline);
            return None;
        }
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => return None,
            _ = sleep_until(shared.deadline()) => {}
            _ = tokio::time::sleep(backoff.next_pause()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use std::{sync::Arc, time::Duration};

    use crate::{LockClient, MemoryBackend};

    #[tokio::test]
    async fn debug_shows_the_grant_and_its_validity() {
        let client = LockClient::new(Arc::new(MemoryBackend::new()));
        let guard = client
            .lock("order:1")
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        let shown = format!("{guard:?}");
        assert!(shown.starts_with("LockGuard {"), "{shown}");
        let owner = format!("owner: {:?}", guard.owner().as_str());
        let token = format!("token: {}", guard.token().get());
        for field in [
            "key: \"order:1\"",
            &owner,
            &token,
            "valid: true",
            "remaining: ",
            "ttl: 60s",
            "loss_reason: None",
        ] {
            assert!(shown.contains(field), "{field} missing from {shown}");
        }
        let handle = format!("{:?}", guard.handle());
        assert!(handle.starts_with("GuardHandle {"), "{handle}");
        assert!(handle.contains("remaining: "), "{handle}");
    }
}
