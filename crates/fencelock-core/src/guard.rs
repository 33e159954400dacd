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
        atomic::{AtomicUsize, Ordering},
        Arc, LazyLock,
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    backend::{AcquireRequest, Backend, Grant},
    clock::Sent,
    deadline::bounded,
    error::{Error, LossReason, Result},
    lease::{Ended, GuardConfig, Shared},
    metrics as m,
    renewer::Renewer,
    types::{FencingToken, LeaseId, LockKey, LockMode, Owner},
};

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
        self.shared.lease.mode
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

    /// Whether the lease is still trusted locally: not lost, not released
    /// (or detached), and the local deadline has not passed.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// The instant until which the lease is trusted locally, on tokio's
    /// monotonic clock (I5: the send of its last confirmed grant or
    /// renewal plus the validity). It only moves forward and stays where
    /// it was once the lease is lost or released, so that a history can
    /// record when a holder that was paused past it stopped trusting;
    /// decisions use [`remaining`](Self::remaining) or
    /// [`check`](Self::check).
    pub fn trusted_until(&self) -> Instant {
        self.shared.deadline()
    }

    /// How long the lease is still trusted locally (zero once lost or
    /// released).
    pub fn remaining(&self) -> Duration {
        if !self.shared.is_valid() {
            return Duration::ZERO;
        }
        self.shared
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// `Ok` while the lease is trusted; [`Error::LockLost`] once it is lost,
    /// [`Error::Released`] once its guard was released (or detached). Call
    /// it right before each critical write (and fence the write: a check
    /// cannot stop a process that pauses between the check and the write).
    pub fn check(&self) -> Result<()> {
        if self.is_valid() {
            Ok(())
        } else {
            if !self.shared.lost.has_fired() && !self.shared.is_finished() {
                // The deadline passed before the renewer noticed.
                self.shared.declare_lost(LossReason::Deadline);
            }
            Err(self.shared.ended_error())
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
    /// the renewal was in flight (the guard is then lost);
    /// [`Error::Released`] after the guard was released or detached; a
    /// transient error if the backend did not answer in time.
    pub async fn renew(&self) -> Result<()> {
        if self.shared.lost.has_fired() || self.shared.is_finished() {
            return Err(self.shared.ended_error());
        }
        let sent = Sent::now();
        let bound = self.shared.renew_bound();
        let (backend, lease, ttl) = (&self.shared.backend, &self.shared.lease, self.shared.ttl);
        match bounded(bound, "renew", backend.renew(lease, ttl)).await {
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
    /// The schedule the lease leaves when the guard finishes.
    renewer: Renewer,
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
        let shared = Shared::new(renewer.next_id(), backend, &request, &grant, sent, config);
        if !renewer.register(Arc::clone(&shared)) {
            // The client was closed while this grant was on its way: it is
            // released like every other lease the client held.
            if shared.close() {
                tokio::spawn(Arc::clone(&shared).free_closed());
            }
        }
        Self {
            handle: GuardHandle { shared },
            renewer: renewer.clone(),
        }
    }

    /// Finishes the lease (see `Shared::finish`) and takes it out of the
    /// renewer's schedule; `true` the first time.
    fn finish(&self, how: Ended) -> bool {
        let first = self.handle.shared.finish(how);
        if first {
            self.renewer.deregister(self.handle.shared.id);
        }
        first
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
        let first = self.finish(Ended::Released);
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
        self.finish(Ended::Detached);
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

/// The releases that dropped guards sent in the background and that have
/// not finished yet, process-wide: what [`wait_for_background_releases`]
/// waits for.
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

static BACKGROUND_RELEASES: LazyLock<InFlight> = LazyLock::new(|| InFlight {
    count: AtomicUsize::new(0),
    idle: Notify::new(),
});

/// One background release, counted while its task lives (also when the
/// runtime drops the task unfinished).
struct Counted;

impl Counted {
    fn new() -> Self {
        BACKGROUND_RELEASES.count.fetch_add(1, Ordering::SeqCst);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if BACKGROUND_RELEASES.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            BACKGROUND_RELEASES.idle.notify_waiters();
        }
    }
}

/// Waits, at most `bound`, until the releases that dropped guards sent in
/// the background (see [`LockGuard`]) are done; `true` when none is left.
/// For a process's exit hook: the Node.js and Python bindings close their
/// clients and then wait here when the process exits normally, so that a
/// guard dropped just before the exit is still released, not left to
/// expire (`docs/nodejs.md`, `docs/python.md`).
pub async fn wait_for_background_releases(bound: Duration) -> bool {
    let idle = async {
        loop {
            let notified = BACKGROUND_RELEASES.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if BACKGROUND_RELEASES.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    };
    tokio::time::timeout(bound, idle).await.is_ok()
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.finish(Ended::Released) {
            return;
        }
        let shared = Arc::clone(&self.handle.shared);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let counted = Counted::new();
            runtime.spawn(async move {
                let _counted = counted;
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

    /// A handle that outlives its guard's `release()` (or `detach()`) holds
    /// nothing: it is not valid, `check()` and `renew()` say it was
    /// released (not lost), and `lost()` still never completes.
    #[tokio::test(start_paused = true)]
    async fn a_released_or_detached_guard_is_no_longer_valid() {
        use crate::Error;
        let client = LockClient::new(Arc::new(MemoryBackend::new()));
        for detach in [false, true] {
            let guard = client
                .lock("order:2")
                .ttl(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap();
            let handle = guard.handle();
            assert!(handle.is_valid());
            if detach {
                guard.detach();
            } else {
                guard.release().await.unwrap();
            }
            assert!(!handle.is_valid());
            assert_eq!(handle.remaining(), Duration::ZERO);
            assert_eq!(handle.loss_reason(), None);
            for result in [handle.check(), handle.renew().await] {
                let e = result.unwrap_err();
                assert!(
                    matches!(e, Error::Released { detached, .. } if detached == detach),
                    "{e:?}"
                );
                assert_eq!(e.code(), "not_held");
                let word = if detach { "detached" } else { "released" };
                assert!(e.to_string().contains(word), "{e}");
                assert!(!e.to_string().contains("lost"), "{e}");
            }
            let lost = tokio::time::timeout(Duration::from_millis(50), handle.lost()).await;
            assert!(lost.is_err(), "lost() completed after the guard ended");
            if detach {
                client.force_release("order:2").await.unwrap();
            }
        }
    }

    /// What an exit hook waits for: once the background release of a
    /// dropped guard is done, the key is free.
    #[tokio::test(start_paused = true)]
    async fn the_background_release_of_a_dropped_guard_can_be_awaited() {
        let client = LockClient::new(Arc::new(MemoryBackend::new()));
        let guard = client
            .lock("dropped")
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        drop(guard);
        assert!(super::wait_for_background_releases(Duration::from_secs(5)).await);
        assert!(client.inspect("dropped").await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
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
