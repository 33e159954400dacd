//! Guard behaviour against a real backend: renewal, loss, cancellation.
//! (Deterministic time-based cases run with a paused clock in the testkit's
//! own tests, against the memory backend.)

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{Error, LossReason};

use super::{client, ensure, guard_ttl, key, owner};
use crate::suite::{Store, TestResult};

/// A renewing guard holds past several TTLs and keeps its token.
pub async fn renewal_outlives_the_ttl(store: &dyn Store) -> TestResult {
    let client = client(store, "renewer").await?;
    let guard = client.lock("renewing").ttl(guard_ttl()).acquire().await?;
    tokio::time::sleep(guard.granted_ttl() * 3).await;
    guard.check()?;
    let lease = client
        .inspect("renewing")
        .await?
        .ok_or("the renewed lease expired")?;
    ensure!(
        lease.token == guard.token(),
        "lease {lease:?}, guard token {}",
        guard.token()
    );
    guard.release().await?;
    ensure!(
        client.inspect("renewing").await?.is_none(),
        "release left the lease"
    );
    Ok(())
}

/// When someone force-releases the lock, the guard's next renewal is refused
/// and `lost()` completes with `Refused`.
pub async fn force_release_is_noticed_as_loss(store: &dyn Store) -> TestResult {
    let client = client(store, "victim").await?;
    let admin = store.connect().await?;
    let guard = client.lock("forced").ttl(guard_ttl()).acquire().await?;
    admin
        .administer()?
        .force_release(&key("forced"))
        .await?
        .ok_or("nothing to force-release")?;
    let bound = guard.granted_ttl() * 10 + super::patient(Duration::from_secs(5));
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| "loss not noticed")?;
    ensure!(reason == LossReason::Refused, "loss reason {reason:?}");
    ensure!(
        !guard.is_valid() && guard.remaining().is_zero(),
        "a lost guard claims validity"
    );
    ensure!(
        matches!(guard.check(), Err(Error::LockLost { .. })),
        "check() passed after loss"
    );
    ensure!(
        guard.cancellation_token().is_cancelled(),
        "cancellation token not cancelled"
    );
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(Error::NotHeld { .. })),
        "release of a lost guard: {released:?}"
    );
    Ok(())
}

/// `with_lock` drops the closure's future when the lock is lost and returns
/// `LockLost`.
pub async fn with_lock_cancels_closure_on_loss(store: &dyn Store) -> TestResult {
    let client = client(store, "worker").await?;
    let admin = store.connect().await?;
    let finished = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(DropFlag(AtomicBool::new(false)));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let work = {
        let (finished, dropped) = (Arc::clone(&finished), Arc::clone(&dropped));
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("with-lock")
                .ttl(guard_ttl())
                .run(|guard| async move {
                    let _armed = Armed(dropped);
                    let _ = started_tx.send(guard.token());
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    started_rx.await.map_err(|_| "the closure never started")?;
    admin
        .administer()?
        .force_release(&key("with-lock"))
        .await?
        .ok_or("nothing to force-release")?;
    let result = tokio::time::timeout(super::patient(Duration::from_secs(30)), work)
        .await
        .map_err(|_| "with_lock kept running")??;
    ensure!(
        matches!(result, Err(Error::LockLost { .. })),
        "with_lock returned {result:?}"
    );
    ensure!(
        !finished.load(Ordering::SeqCst),
        "the closure ran to completion"
    );
    ensure!(
        dropped.0.load(Ordering::SeqCst),
        "the closure's future was not dropped"
    );
    Ok(())
}

struct DropFlag(AtomicBool);
struct Armed(Arc<DropFlag>);
impl Drop for Armed {
    fn drop(&mut self) {
        self.0 .0.store(true, Ordering::SeqCst);
    }
}

/// Dropping a guard releases its lease soon after, without waiting for expiry.
pub async fn dropped_guard_releases_in_background(store: &dyn Store) -> TestResult {
    let client = client(store, "dropper").await?;
    let guard = client
        .lock("dropped")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await?;
    drop(guard);
    let within = super::patient(Duration::from_secs(10));
    let bound = tokio::time::Instant::now() + within;
    while client.inspect("dropped").await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < bound,
            "the dropped guard's lease is still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A guard whose server restarts either keeps its lease (durable backends:
/// renewal resumes) or reports the loss — and never both believes it holds
/// the lock and lets someone else take it.
pub async fn restart_keeps_or_loses_lock_honestly(store: &dyn Store) -> TestResult {
    let client = client(store, "survivor").await?;
    let guard = client
        .lock("restart")
        .ttl(super::patient(Duration::from_secs(4)))
        .acquire()
        .await?;
    store.restart().await?;
    let other = store.connect().await?;
    let rival = fencelock_core::AcquireRequest::new(
        key("restart"),
        owner("rival"),
        Duration::from_secs(30),
    );
    // Probe for a while after the restart: whenever the rival wins, the
    // guard must have stopped trusting its lease by the time the answer is
    // back (the backend's lease ended before the rival's request arrived).
    let until = tokio::time::Instant::now() + guard.granted_ttl() * 2;
    while tokio::time::Instant::now() < until {
        match other.try_acquire(&rival).await {
            Ok(fencelock_core::Acquire::Granted(g)) => {
                ensure!(
                    !guard.is_valid(),
                    "the rival got token {} while the guard (token {}) was valid",
                    g.token,
                    guard.token()
                );
                ensure!(
                    g.token > guard.token(),
                    "rival token {} <= {}",
                    g.token,
                    guard.token()
                );
                return Ok(());
            }
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The lease survived: the guard must have kept renewing it.
    guard.check()?;
    let lease = other
        .inspect(&key("restart"))
        .await?
        .ok_or("lease gone but guard valid")?;
    ensure!(
        lease.token == guard.token(),
        "lease {lease:?} is not the guard's"
    );
    Ok(())
}
