//! `LockGuard`: a held lease and its loss signal.
//!
//! A guard does not run a task of its own: it registers with its client's
//! renewer (`renewer.rs`), which renews it every `renew_every` and, whether or
//! not it renews, fires the loss signal when the conservative local deadline
//! (I5) passes without a confirmed renewal. The deadline is computed from the
//! instant *before* each request was sent, so the signal fires before the
//! backend's lease can end.

use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock, PoisonError,
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    backend::{AcquireRequest, Backend, Grant},
    client::{bounded, ClockPolicy},
    clock::{boot_time, Sent},
    error::{Error, LossReason, Result},
    metrics as m,
    renewer::Renewer,
    types::{FencingToken, LeaseId, LockKey, LockMode, Owner, MIN_TTL},
};

/// Settings a guard takes from its request and client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GuardConfig {
    pub(crate) renew_every: Option<Duration>,
    pub(crate) clock: ClockPolicy,
    pub(crate) op_timeout: Duration,
    /// A writer's (or plain lock's) lease, or a reader's.
    pub(crate) mode: LockMode,
    /// Lock delay: how long after the grant the key stays unavailable to
    /// others, however early it is released.
    pub(crate) hold_at_least: Option<Duration>,
}

/// What a guard, its handles and the renewer share.
pub(crate) struct Shared {
    /// The guard's id in its client's renewer.
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) lease: LeaseId,
    pub(crate) mode: LockMode,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    renewer: Renewer,
    clock: ClockPolicy,
    op_timeout: Duration,
    /// When the grant's answer arrived, which is after the backend granted
    /// it: a lock delay counted from here ends no earlier on the backend.
    granted_at: Instant,
    hold_at_least: Option<Duration>,
    /// What each confirmed grant or renewal updates, under one lock.
    trust: Mutex<Trust>,
    /// Whether the hold has been recorded in the metrics (on loss or finish,
    /// whichever comes first).
    accounted: AtomicBool,
    lost: LossSignal,
    reason: OnceLock<LossReason>,
    /// Set when the guard is released, dropped or detached: a loss is no
    /// longer signalled.
    finished: AtomicBool,
}

/// How far a lease is trusted, as of the last confirmed grant or renewal.
#[derive(Clone, Copy)]
struct Trust {
    /// Latest instant until which the lease is trusted locally.
    deadline: Instant,
    /// The same limit on the boot-time clock, which keeps counting while the
    /// machine is suspended (see `clock.rs`).
    boot_deadline: Option<Duration>,
    /// The TTL the backend last granted (etcd may round up).
    granted_ttl: Duration,
    /// Backend-reported end of the lease, for display.
    expires_at: DateTime<Utc>,
}

impl Trust {
    fn boot_ok(&self) -> bool {
        match (self.boot_deadline, boot_time()) {
            (Some(limit), Some(now)) => now < limit,
            _ => true,
        }
    }
}

/// The loss signal: fired once. The cancellation token that waiters use is
/// made only when someone first asks for it: most guards are never waited
/// on, and a token costs an allocation of about a hundred bytes per held
/// lock.
#[derive(Default)]
struct LossSignal {
    fired: AtomicBool,
    token: Mutex<Option<CancellationToken>>,
}

impl LossSignal {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        self.token.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fire(&self) {
        let token = self.lock();
        self.fired.store(true, Ordering::SeqCst);
        if let Some(token) = token.as_ref() {
            token.cancel();
        }
    }

    fn has_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// The token cancelled when the signal fires (already cancelled if it
    /// has). Made under the same lock as `fire` sets the flag, so it cannot
    /// miss a loss.
    fn token(&self) -> CancellationToken {
        let mut token = self.lock();
        let token = token.get_or_insert_with(CancellationToken::new);
        if self.fired.load(Ordering::SeqCst) {
            token.cancel();
        }
        token.clone()
    }
}

impl Shared {
    fn trust(&self) -> Trust {
        *self.trust.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.trust().deadline
    }

    /// Whether the boot-time clock is still inside the trusted window.
    pub(crate) fn boot_ok(&self) -> bool {
        self.trust().boot_ok()
    }

    /// Records a confirmed grant/renewal whose request left at `sent`.
    pub(crate) fn extend(&self, sent: Sent, grant: &Grant) {
        let valid_for = self.clock.valid_for(grant.ttl);
        let trusted_until = sent.mono + valid_for;
        let mut trust = self.trust.lock().unwrap_or_else(PoisonError::into_inner);
        if trusted_until > trust.deadline {
            trust.deadline = trusted_until;
            trust.boot_deadline = sent.boot.map(|b| b + valid_for);
        }
        trust.granted_ttl = grant.ttl;
        trust.expires_at = grant.expires_at;
    }

    /// Records the hold once: at loss, release, drop or detach.
    fn account_hold(&self) {
        if self.accounted.swap(true, Ordering::SeqCst) {
            return;
        }
        let backend = self.backend.name();
        ::metrics::gauge!(m::HELD, "backend" => backend).decrement(1.0);
        ::metrics::histogram!(m::HOLD_SECONDS, "backend" => backend)
            .record(self.granted_at.elapsed().as_secs_f64());
    }

    /// Whether the loss was declared already.
    pub(crate) fn is_lost(&self) -> bool {
        self.reason.get().is_some()
    }

    /// Signals the loss, once, unless the guard already finished.
    pub(crate) fn declare_lost(&self, reason: LossReason) {
        if self.finished.load(Ordering::SeqCst) || self.reason.set(reason).is_err() {
            return;
        }
        let backend = self.backend.name();
        ::metrics::counter!(m::LOCKS_LOST, "backend" => backend, "reason" => reason.as_str())
            .increment(1);
        if reason != LossReason::Closed {
            tracing::warn!(
                key = %self.lease.key, owner = %self.lease.owner, token = %self.lease.token,
                backend, reason = reason.as_str(), "lock lost: {reason}"
            );
        }
        self.account_hold();
        self.lost.fire();
    }

    fn lost_error(&self) -> Error {
        Error::LockLost {
            key: self.lease.key.clone(),
            token: self.lease.token,
            reason: self.reason.get().copied().unwrap_or(LossReason::Deadline),
        }
    }

    fn is_valid(&self) -> bool {
        if self.lost.has_fired() {
            return false;
        }
        let trust = self.trust();
        Instant::now() < trust.deadline && trust.boot_ok()
    }

    /// How long one renewal may take: a hung connection costs one attempt,
    /// not the whole remaining lease. Measured on the lease the backend
    /// granted, which may be longer than the one asked for (etcd rounds up).
    pub(crate) fn renew_bound(&self) -> Duration {
        let granted = self.trust().granted_ttl;
        self.op_timeout
            .min(granted / 3)
            .max(Duration::from_millis(1))
    }

    /// Stops renewal and records the hold; `true` the first time.
    fn finish(&self) -> bool {
        if self.finished.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.renewer.deregister(self.id);
        self.account_hold();
        true
    }

    /// Releases the lease on the backend, bounded by the operation timeout.
    /// Inside a lock delay the lease is not deleted but renewed to what is
    /// left of the delay (`docs/lock-delay.md`): the backend's clock ends it,
    /// no earlier than the grant plus the delay, and nobody is woken before.
    async fn release(&self) -> Result<()> {
        let left = self
            .hold_at_least
            .and_then(|d| d.checked_sub(self.granted_at.elapsed()))
            .filter(|left| !left.is_zero());
        let call = async {
            match left {
                // The shortest lease a backend is asked for: a longer one
                // only keeps the key a little longer, never shorter.
                Some(left) => self
                    .backend
                    .renew(&self.lease, left.max(MIN_TTL))
                    .await
                    .map(|_| ()),
                None => release_as(&*self.backend, &self.lease, self.mode).await,
            }
        };
        bounded(self.op_timeout, "release", call).await
    }

    /// After a loss at the local deadline the lease may still be live on
    /// the backend (the renewals went unanswered, not refused): hands it
    /// back so that the next holder need not wait out its TTL, and so that
    /// a lease shared with other locks (etcd) does not keep this key alive.
    /// Best effort: if the backend cannot be reached, the lease expires.
    pub(crate) async fn release_after_loss(self: Arc<Self>) {
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        match self.release().await {
            Ok(()) | Err(Error::NotHeld { .. }) => {}
            Err(e) => tracing::debug!(
                key = %self.lease.key, error = %e,
                "could not hand back a lost lease; it will expire"
            ),
        }
    }

    /// Releases on behalf of [`crate::LockClient::close`]: the guard is
    /// lost for its holder (reason [`LossReason::Closed`]) and its lease
    /// freed.
    pub(crate) async fn close(self: Arc<Self>) -> Result<()> {
        self.declare_lost(LossReason::Closed);
        if !self.finish() {
            return Ok(());
        }
        match self.release().await {
            Ok(()) | Err(Error::NotHeld { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Releases `lease` held in `mode`: the one place that picks the backend
/// call for each side of a read-write lock.
pub(crate) async fn release_as(
    backend: &dyn Backend,
    lease: &LeaseId,
    mode: LockMode,
) -> Result<()> {
    match mode {
        LockMode::Exclusive => backend.release(lease).await,
        LockMode::Shared => backend.release_shared(lease).await,
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
        &self.shared.lease.key
    }

    /// The owner the lock is held as.
    pub fn owner(&self) -> &Owner {
        &self.shared.lease.owner
    }

    /// The fencing token of this grant: present it to every fenced resource.
    pub fn token(&self) -> FencingToken {
        self.shared.lease.token
    }

    /// The lease this guard holds: key, owner and token.
    pub fn lease(&self) -> &LeaseId {
        &self.shared.lease
    }

    /// Whether this is a writer's (or plain lock's) lease or a reader's;
    /// what to pass to [`crate::Fence::admit_shared`].
    pub fn mode(&self) -> LockMode {
        self.shared.mode
    }

    /// The requested lease length.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The lease length the backend last granted; longer than
    /// [`ttl`](Self::ttl) where the backend rounds up (etcd).
    pub fn granted_ttl(&self) -> Duration {
        self.shared.trust().granted_ttl
    }

    /// End of the lease as the backend last reported it (backend clock; for
    /// display, not for decisions — use [`remaining`](Self::remaining)).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.shared.trust().expires_at
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
            if !self.shared.lost.has_fired() {
                // The deadline passed before the renewer noticed.
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
            shared.lost.token().cancelled_owned().await;
            shared.reason.get().copied().unwrap_or(LossReason::Deadline)
        }
    }

    /// A token cancelled when the lock is lost, to hand to work that should
    /// stop then. Cancelling it yourself does not affect the lock.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.token().child_token()
    }

    /// Renews now, in addition to the background renewal.
    /// [`Error::LockLost`] if the backend refused or the lock was lost while
    /// the renewal was in flight (the guard is then lost); a transient error
    /// if the backend did not answer in time.
    pub async fn renew(&self) -> Result<()> {
        if self.shared.lost.has_fired() {
            return Err(self.shared.lost_error());
        }
        let sent = Sent::now();
        let bound = self.shared.renew_bound();
        let (backend, lease, ttl) = (&self.shared.backend, &self.shared.lease, self.shared.ttl);
        let renewal = async move {
            match self.shared.mode {
                LockMode::Exclusive => backend.renew(lease, ttl).await,
                LockMode::Shared => backend.renew_shared(lease, ttl).await,
            }
        };
        match bounded(bound, "renew", renewal).await {
            Ok(grant) => {
                self.shared.extend(sent, &grant);
                ::metrics::counter!(m::RENEWALS, "backend" => self.shared.backend.name())
                    .increment(1);
                // The renewer may have given up at the deadline meanwhile;
                // a loss, once signalled, is final.
                if self.shared.lost.has_fired() {
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
            .field("mode", &self.mode())
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
}

impl LockGuard {
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        renewer: &Renewer,
        request: AcquireRequest,
        grant: Grant,
        sent: Sent,
        config: GuardConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            id: renewer.next_id(),
            lease: request.lease(grant.token),
            mode: config.mode,
            backend,
            ttl: request.ttl,
            renew_every: config.renew_every,
            renewer: renewer.clone(),
            clock: config.clock,
            op_timeout: config.op_timeout,
            granted_at: Instant::now(),
            hold_at_least: config.hold_at_least,
            trust: Mutex::new(Trust {
                deadline: sent.mono,
                boot_deadline: None,
                granted_ttl: grant.ttl,
                expires_at: grant.expires_at,
            }),
            accounted: AtomicBool::new(false),
            lost: LossSignal::default(),
            reason: OnceLock::new(),
            finished: AtomicBool::new(false),
        });
        shared.extend(sent, &grant);
        ::metrics::gauge!(m::HELD, "backend" => shared.backend.name()).increment(1.0);
        if !renewer.register(Arc::clone(&shared), config.renew_every) {
            // The client was closed while this grant was on its way: it is
            // released like every other lease the client held.
            tokio::spawn(Arc::clone(&shared).close());
        }
        Self {
            handle: GuardHandle { shared },
        }
    }

    /// A cloneable handle that outlives borrows of the guard.
    pub fn handle(&self) -> GuardHandle {
        self.handle.clone()
    }

    /// Stops renewal and releases the lease now.
    ///
    /// [`Error::NotHeld`] when the backend no longer had this lease (it was
    /// lost, taken over or force-released). `Ok` when the client was closed
    /// ([`crate::LockClient::close`] released it already).
    pub async fn release(self) -> Result<()> {
        let shared = Arc::clone(&self.handle.shared);
        // Finished first, so that dropping `self` does not release as well.
        let first = shared.finish();
        drop(self);
        if !first {
            // Only `close` finishes a guard that its holder still owns.
            return Ok(());
        }
        let released = shared.release().await;
        if released.is_ok() {
            tracing::debug!(key = %shared.lease.key, token = %shared.lease.token, "released");
        }
        released
    }

    /// Stops renewing and hands the lease over without releasing it: it stays
    /// on the backend until it expires or someone renews or releases it by
    /// (owner, token), e.g. another process (`fencelock acquire` uses this).
    /// Read [`token`](GuardHandle::token) and [`owner`](GuardHandle::owner)
    /// first.
    pub fn detach(self) {
        // Finished, so that dropping `self` does not release.
        self.handle.shared.finish();
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
        let shared = Arc::clone(&self.handle.shared);
        if !shared.finish() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                match shared.release().await {
                    Ok(()) | Err(Error::NotHeld { .. }) => {}
                    Err(e) => tracing::warn!(key = %shared.lease.key, error = %e,
                        "background release failed; the lease will expire"),
                }
            });
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
