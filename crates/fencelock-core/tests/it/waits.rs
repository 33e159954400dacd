//! The client's side of backends that wait where the key is
//! (`Capabilities::waits`, the `http://` lock service): a waiting
//! acquisition asks the backend to wait in stretches no longer than a third
//! of the TTL and the time left, takes no wake-up subscription of its own,
//! and is granted within the stretch in which the key is released; a single
//! try never waits there; a backend that claims the capability but answers
//! at once is waited for with backoff, not asked again in a busy loop; and
//! a queued wait on a fair backend keeps its single tries. The memory
//! backend does the locking; a wrapper claims `waits` and records what the
//! client asked of it.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Error, Grant, LeaseId, LockClient, LockGuard,
    LockInfo, LockKey, MemoryBackend, Owner, Result, WakeSubscription,
};
use tokio::time::Instant;

#[derive(Debug, Default)]
struct Waiting {
    inner: MemoryBackend,
    /// Claims `fair` as well.
    fair: bool,
    /// Claims `waits` but answers every waiting attempt at once.
    answers_at_once: bool,
    stretches: Mutex<Vec<Duration>>,
    /// Every attempt: its `queue` flag, and whether it could wait.
    attempts: Mutex<Vec<(bool, bool)>>,
    subscriptions: AtomicUsize,
}

#[async_trait]
impl Backend for Waiting {
    fn name(&self) -> &'static str {
        "waiting"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_waits(true)
            .with_fair(self.fair)
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.attempts.lock().unwrap().push((request.queue, false));
        self.inner.try_acquire(request).await
    }
    async fn try_acquire_waiting(
        &self,
        request: &AcquireRequest,
        wait: Duration,
    ) -> Result<Acquire> {
        self.attempts.lock().unwrap().push((request.queue, true));
        self.stretches.lock().unwrap().push(wait);
        if self.answers_at_once {
            return self.inner.try_acquire(request).await;
        }
        // As the service does: wait with the store's own wake-ups.
        let deadline = Instant::now() + wait;
        let mut woken = self.inner.subscribe(&request.key).await?;
        loop {
            match self.inner.try_acquire(request).await? {
                Acquire::Held(holder) if Instant::now() < deadline => {
                    let Some(sub) = woken.as_mut() else {
                        return Ok(Acquire::Held(holder));
                    };
                    tokio::select! {
                        _ = sub.woken() => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                answer => return Ok(answer),
            }
        }
    }
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        self.subscriptions.fetch_add(1, Ordering::SeqCst);
        self.inner.subscribe(key).await
    }
}

fn client(backend: &Arc<Waiting>, name: &str) -> LockClient {
    LockClient::builder(Arc::clone(backend) as Arc<dyn Backend>)
        .owner(Owner::new(name).unwrap())
        .build()
        .unwrap()
}

const TTL: Duration = Duration::from_secs(30);

/// `k`, taken by "holder" for [`TTL`].
async fn hold(backend: &Arc<Waiting>) -> LockGuard {
    client(backend, "holder")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap()
}

/// `k`, waited for by "waiter" for at most `wait`.
async fn wait_for(backend: &Arc<Waiting>, wait: Duration) -> Result<LockGuard> {
    client(backend, "waiter")
        .lock("k")
        .ttl(TTL)
        .wait(wait)
        .acquire()
        .await
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_asked_of_the_backend_in_stretches_and_granted_in_the_stretch_of_the_release() {
    let backend = Arc::new(Waiting::default());
    let holder = hold(&backend).await;
    let waiter = client(&backend, "waiter");
    let wait = tokio::spawn(async move {
        let guard = waiter
            .lock("k")
            .ttl(TTL)
            .wait(Duration::from_secs(45))
            .acquire()
            .await;
        (waiter, guard)
    });
    // Two whole stretches pass with the key held.
    tokio::time::sleep(TTL / 3 * 2 + Duration::from_secs(1)).await;
    holder.release().await.unwrap();
    let (_waiter, guard) = wait.await.unwrap();
    let guard = guard.unwrap();
    assert_eq!(guard.owner().as_str(), "waiter");
    let stretches = backend.stretches.lock().unwrap().clone();
    assert_eq!(stretches, [TTL / 3; 3], "one stretch per third of the TTL");
    assert_eq!(backend.subscriptions.load(Ordering::SeqCst), 0);
    assert!(
        backend.attempts.lock().unwrap()[1..].iter().all(|a| a.1),
        "every attempt of the wait (after the holder's) may wait"
    );
}

#[tokio::test(start_paused = true)]
async fn the_last_stretch_ends_at_the_deadline_and_a_single_try_never_waits() {
    let backend = Arc::new(Waiting::default());
    let _holder = hold(&backend).await;
    let started = Instant::now();
    let waited = wait_for(&backend, Duration::from_secs(15)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(15) && took < Duration::from_millis(15_100),
        "{took:?}"
    );
    assert_eq!(
        *backend.stretches.lock().unwrap(),
        [TTL / 3, Duration::from_secs(5)]
    );
    let tried = client(&backend, "other").try_lock("k").await.unwrap();
    assert!(tried.is_none());
    assert_eq!(backend.stretches.lock().unwrap().len(), 2);
    assert_eq!(
        backend.attempts.lock().unwrap().last(),
        Some(&(false, false))
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_answers_at_once_is_waited_for_with_backoff() {
    let backend = Arc::new(Waiting {
        answers_at_once: true,
        ..Waiting::default()
    });
    let _holder = hold(&backend).await;
    let waited = wait_for(&backend, Duration::from_secs(5)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    // Jittered backoff doubling from 1 ms to 1 s: about twenty attempts in
    // 5 s (a busy loop would never let the paused clock move at all).
    let attempts = backend.attempts.lock().unwrap().len();
    assert!((3..=200).contains(&attempts), "{attempts} attempts");
}

#[tokio::test(start_paused = true)]
async fn on_a_fair_backend_a_wait_keeps_its_entry_with_single_tries() {
    let backend = Arc::new(Waiting {
        fair: true,
        ..Waiting::default()
    });
    let _holder = hold(&backend).await;
    let waited = wait_for(&backend, Duration::from_secs(2)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let attempts = backend.attempts.lock().unwrap().clone();
    assert!(
        attempts[1..].iter().all(|&a| a == (true, false)),
        "{attempts:?}"
    );
    // One try of a wait run across requests (a lock service's client).
    let tried = client(&backend, "other")
        .lock("k")
        .ttl(TTL)
        .queued(true)
        .try_acquire()
        .await
        .unwrap();
    assert!(tried.is_none());
    assert_eq!(
        backend.attempts.lock().unwrap().last(),
        Some(&(true, false))
    );
}
