//! The state of one held lease, shared by its guard, the guard's handles and
//! the client's renewer (`renewer.rs`): how far the lease is trusted (I5),
//! its loss signal, and how it is released. It sits below both the guard and
//! the renewer, which each use it and know nothing of the other's insides.

use std::{
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
    clock::{boot_time, ClockPolicy, Sent},
    deadline::bounded,
    error::{Error, LossReason, Result},
    metrics as m,
    types::{LeaseId, MIN_TTL},
};

/// The `tracing` target of the one warning a loss logs, so that a program
/// that reports losses itself (the CLI's `run`) can leave this one out
/// without depending on where in the crate it is raised.
pub const LOSS_LOG_TARGET: &str = "fencelock::loss";

/// Settings a guard takes from its request and client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GuardConfig {
    pub(crate) renew_every: Option<Duration>,
    pub(crate) clock: ClockPolicy,
    pub(crate) op_timeout: Duration,
    /// Lock delay: how long after the grant the key stays unavailable to
    /// others, however early it is released.
    pub(crate) hold_at_least: Option<Duration>,
}

/// What a guard, its handles and the renewer share.
pub(crate) struct Shared {
    /// The guard's id in its client's renewer.
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn Backend>,
    /// The lease, with the side of its key it holds.
    pub(crate) lease: LeaseId,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
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
    pub(crate) lost: LossSignal,
    pub(crate) reason: OnceLock<LossReason>,
    /// Set when the guard is released, dropped, detached or closed: a loss
    /// is no longer signalled, and the guard is no longer valid.
    finished: AtomicBool,
    /// How the guard finished, for the error its handles answer after.
    ended: OnceLock<Ended>,
}

/// How a guard stopped holding its lease other than by a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// `release()`, or the guard was dropped (released in the background).
    Released,
    /// `detach()`: the lease was handed over, not released.
    Detached,
    /// The client was closed (a loss with reason `closed` as well).
    Closed,
}

/// How far a lease is trusted, as of the last confirmed grant or renewal.
#[derive(Clone, Copy)]
pub(crate) struct Trust {
    /// Latest instant until which the lease is trusted locally.
    pub(crate) deadline: Instant,
    /// The same limit on the boot-time clock, which keeps counting while the
    /// machine is suspended (see `clock.rs`).
    pub(crate) boot_deadline: Option<Duration>,
    /// The TTL the backend last granted (etcd may round up).
    pub(crate) granted_ttl: Duration,
    /// Backend-reported end of the lease, for display.
    pub(crate) expires_at: DateTime<Utc>,
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
pub(crate) struct LossSignal {
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

    pub(crate) fn has_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// The token cancelled when the signal fires (already cancelled if it
    /// has). Made under the same lock as `fire` sets the flag, so it cannot
    /// miss a loss.
    pub(crate) fn token(&self) -> CancellationToken {
        let mut token = self.lock();
        let token = token.get_or_insert_with(CancellationToken::new);
        if self.fired.load(Ordering::SeqCst) {
            token.cancel();
        }
        token.clone()
    }
}

impl Shared {
    /// The state of a lease just granted to `request` by `grant`, whose
    /// request left at `sent`; `id` is its place in the renewer's schedule.
    pub(crate) fn new(
        id: u64,
        backend: Arc<dyn Backend>,
        request: &AcquireRequest,
        grant: &Grant,
        sent: Sent,
        config: GuardConfig,
    ) -> Arc<Self> {
        let shared = Arc::new(Self {
            id,
            lease: request.lease(grant.token),
            backend,
            ttl: request.ttl,
            renew_every: config.renew_every,
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
            ended: OnceLock::new(),
        });
        shared.extend(sent, grant);
        ::metrics::gauge!(m::HELD, "backend" => shared.backend.name()).increment(1.0);
        shared
    }

    pub(crate) fn trust(&self) -> Trust {
        *self.trust.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.trust().deadline
    }

    /// Whether the boot-time clock is still inside the trusted window.
    pub(crate) fn boot_ok(&self) -> bool {
        self.trust().boot_ok()
    }

    /// How often to renew: `renew_every`, shortened in proportion when the
    /// backend granted less than the TTL asked for (ZooKeeper's
    /// `layout=curator` grants at most half its session timeout): the period
    /// was chosen for the requested TTL, and renewing a shorter lease at
    /// that pace would let its trusted window end before the next renewal.
    /// A longer grant (etcd rounds up) keeps the period chosen.
    pub(crate) fn renew_period(&self) -> Option<Duration> {
        let granted = self.trust().granted_ttl;
        self.renew_every.map(|period| {
            if granted < self.ttl && !self.ttl.is_zero() {
                period
                    .mul_f64(granted.as_secs_f64() / self.ttl.as_secs_f64())
                    .max(Duration::from_millis(1))
            } else {
                period
            }
        })
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
                target: LOSS_LOG_TARGET,
                key = %self.lease.key, owner = %self.lease.owner, token = %self.lease.token,
                backend, reason = reason.as_str(), "lock lost: {reason}"
            );
        }
        self.account_hold();
        self.lost.fire();
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::LockLost {
            key: self.lease.key.clone(),
            token: self.lease.token,
            reason: self.reason.get().copied().unwrap_or(LossReason::Deadline),
        }
    }

    pub(crate) fn is_valid(&self) -> bool {
        if self.lost.has_fired() || self.finished.load(Ordering::SeqCst) {
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

    /// Marks the lease finished (no loss is signalled any more) and records
    /// the hold; `true` the first time. The caller takes it out of the
    /// renewer's schedule, which this module does not know.
    pub(crate) fn finish(&self, how: Ended) -> bool {
        if self.finished.swap(true, Ordering::SeqCst) {
            return false;
        }
        let _ = self.ended.set(how);
        self.account_hold();
        true
    }

    /// Releases the lease on the backend, bounded by the operation timeout.
    /// Inside a lock delay the lease is not deleted but renewed to what is
    /// left of the delay (`docs/lock-delay.md`): the backend's clock ends it,
    /// no earlier than the grant plus the delay, and nobody is woken before.
    pub(crate) async fn release(&self) -> Result<()> {
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
                None => self.backend.release(&self.lease).await,
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

    /// The first half of [`crate::LockClient::close`] for this guard: it is
    /// lost for its holder at once (reason [`LossReason::Closed`]); true when
    /// its lease is still to be freed by [`Shared::free_closed`].
    pub(crate) fn close(&self) -> bool {
        self.declare_lost(LossReason::Closed);
        self.finish(Ended::Closed)
    }

    /// What a handle answers when asked to act for this lease after it
    /// ended: [`Error::LockLost`] after a loss (the reason says which),
    /// [`Error::Released`] after its holder released or detached it.
    pub(crate) fn ended_error(&self) -> Error {
        if self.is_lost() {
            return self.lost_error();
        }
        match self.ended.get() {
            Some(Ended::Released) => Error::Released {
                key: self.lease.key.clone(),
                token: self.lease.token,
                detached: false,
            },
            Some(Ended::Detached) => Error::Released {
                key: self.lease.key.clone(),
                token: self.lease.token,
                detached: true,
            },
            // Closed declares a loss first; a lease not yet finished that
            // is not valid has passed its deadline.
            Some(Ended::Closed) | None => self.lost_error(),
        }
    }

    /// Whether the guard finished (released, dropped, detached or closed).
    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// The second half: frees the lease of a guard that [`Shared::close`]
    /// ended.
    pub(crate) async fn free_closed(self: Arc<Self>) -> Result<()> {
        match self.release().await {
            Ok(()) | Err(Error::NotHeld { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
