//! The client's side of fair backends (`docs/fairness.md`): which attempts
//! carry `AcquireRequest::queue`, that a wait ending without a grant leaves
//! the queue (returned or dropped), and that the wait retries often enough
//! to keep its entry alive. The memory backend does the locking; a wrapper
//! claims `fair` and records what the client asked of it. The engines'
//! queues themselves are checked by the conformance suite (`fair` cases).
//!
//! Also how often a waiter tries between wake-ups: with a complete source
//! (`WakeSubscription::complete`) once a second, woken by the release; with
//! a best-effort one on a backoff that starts at a millisecond.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, FairQueue, Grant, LeaseId, LockClient,
    LockInfo, LockKey, MemoryBackend, Owner, Result, WakeSubscription,
};
use tokio::{sync::mpsc, time::Instant};

/// What the client asked: each attempt's `queue` flag and when it was
/// sent, and each `leave_queue`.
#[derive(Debug)]
struct Recording {
    inner: MemoryBackend,
    fair: bool,
    /// Marks the wake-up subscriptions complete.
    complete: bool,
    attempts: Mutex<Vec<(bool, Instant)>>,
    attempted: mpsc::UnboundedSender<()>,
    left: mpsc::UnboundedSender<(LockKey, Owner)>,
}

struct Probes {
    attempted: mpsc::UnboundedReceiver<()>,
    left: mpsc::UnboundedReceiver<(LockKey, Owner)>,
}

fn recording(fair: bool) -> (Arc<Recording>, Probes) {
    let (attempted, attempted_rx) = mpsc::unbounded_channel();
    let (left, left_rx) = mpsc::unbounded_channel();
    let backend = Arc::new(Recording {
        inner: MemoryBackend::new(),
        fair,
        complete: false,
        attempts: Mutex::default(),
        attempted,
        left,
    });
    let probes = Probes {
        attempted: attempted_rx,
        left: left_rx,
    };
    (backend, probes)
}

impl Recording {
    fn queued_flags(&self) -> Vec<bool> {
        self.attempts.lock().unwrap().iter().map(|a| a.0).collect()
    }
}

#[async_trait]
impl Backend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_fair(self.fair)
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.attempts
            .lock()
            .unwrap()
            .push((request.queue, Instant::now()));
        let answer = self.inner.try_acquire(request).await;
        let _ = self.attempted.send(());
        answer
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
        let sub = self.inner.subscribe(key).await?;
        Ok(sub.map(|s| if self.complete { s.complete() } else { s }))
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.fair.then_some(self as &dyn FairQueue)
    }
}

#[async_trait]
impl FairQueue for Recording {
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let _ = self.left.send((key.clone(), owner.clone()));
        Ok(())
    }
    async fn queue(&self, _key: &LockKey) -> Result<Vec<LockInfo>> {
        Ok(Vec::new())
    }
}

/// A client of `backend` as `name`.
fn client(backend: &Arc<Recording>, name: &str) -> LockClient {
    LockClient::builder(Arc::clone(backend) as Arc<dyn Backend>)
        .owner(Owner::new(name).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_single_try_never_queues_nor_leaves() {
    let (backend, mut probes) = recording(true);
    let holder = client(&backend, "holder").try_lock("k").await.unwrap();
    assert!(holder.is_some());
    let tried = client(&backend, "other").try_lock("k").await.unwrap();
    assert!(tried.is_none());
    assert_eq!(backend.queued_flags(), [false, false]);
    assert!(probes.left.try_recv().is_err(), "a single try left a queue");
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_times_out_queues_every_attempt_and_leaves_before_returning() {
    let (backend, mut probes) = recording(true);
    let _holder = client(&backend, "holder")
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waited = client(&backend, "waiter")
        .lock("k")
        .wait(Duration::from_secs(2))
        .acquire()
        .await;
    assert!(matches!(waited, Err(fencelock_core::Error::Timeout { .. })));
    let flags = backend.queued_flags();
    assert_eq!(flags.first(), Some(&false), "the holder's grant: {flags:?}");
    assert!(flags.len() > 2, "{flags:?}");
    assert!(flags[1..].iter().all(|q| *q), "{flags:?}");
    let (key, owner) = probes.left.try_recv().expect("the wait left no queue");
    assert_eq!((key.as_str(), owner.as_str()), ("k", "waiter"));
    assert!(probes.left.try_recv().is_err(), "left the queue twice");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_leaves_the_queue() {
    let (backend, mut probes) = recording(true);
    let _holder = client(&backend, "holder").try_lock("k").await.unwrap();
    probes.attempted.recv().await.unwrap();
    let waiter = client(&backend, "waiter");
    let wait = tokio::spawn(async move {
        waiter
            .lock("k")
            .wait(Duration::from_secs(3600))
            .acquire()
            .await
            .map(|_| ())
    });
    // Its first attempt was refused: an entry may exist now.
    probes.attempted.recv().await.unwrap();
    wait.abort();
    assert!(wait.await.unwrap_err().is_cancelled());
    let (key, owner) = probes.left.recv().await.unwrap();
    assert_eq!((key.as_str(), owner.as_str()), ("k", "waiter"));
}

#[tokio::test(start_paused = true)]
async fn a_granted_wait_does_not_leave() {
    let (backend, mut probes) = recording(true);
    let holder = client(&backend, "holder").try_lock("k").await.unwrap();
    probes.attempted.recv().await.unwrap();
    let waiter = client(&backend, "waiter");
    let wait = tokio::spawn(async move {
        waiter
            .lock("k")
            .wait(Duration::from_secs(3600))
            .acquire()
            .await
    });
    probes.attempted.recv().await.unwrap();
    holder.unwrap().release().await.unwrap();
    let guard = wait.await.unwrap().unwrap();
    assert!(backend.queued_flags()[1..].iter().all(|q| *q));
    guard.release().await.unwrap();
    assert!(probes.left.try_recv().is_err(), "a granted wait left");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_refreshes_its_entry_at_least_every_third_of_the_ttl() {
    let (backend, _probes) = recording(true);
    let _holder = client(&backend, "holder")
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let ttl = Duration::from_millis(300);
    let _ = client(&backend, "waiter")
        .lock("k")
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    let sent: Vec<Instant> = backend.attempts.lock().unwrap()[1..]
        .iter()
        .map(|a| a.1)
        .collect();
    let longest = sent.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    // Paused clock: the gap is the pause itself.
    assert!(longest <= ttl / 3, "an entry went {longest:?} unrefreshed");
}

#[tokio::test(start_paused = true)]
async fn nothing_queues_on_a_backend_that_does_not_claim_fair() {
    let (backend, mut probes) = recording(false);
    let _holder = client(&backend, "holder").try_lock("k").await.unwrap();
    let waited = client(&backend, "waiter")
        .lock("k")
        .wait(Duration::from_secs(2))
        .acquire()
        .await;
    assert!(waited.is_err());
    assert!(backend.queued_flags().iter().all(|q| !q));
    assert!(probes.left.try_recv().is_err());
}

/// The tries a waiter made in 10 s of a 30 s lease held by another owner,
/// its subscription `complete` or not; the release then wakes it into a
/// grant.
async fn tries_while_held(complete: bool) -> usize {
    let (backend, _probes) = recording(false);
    let mut backend = Arc::into_inner(backend).unwrap();
    backend.complete = complete;
    let backend = Arc::new(backend);
    let ttl = Duration::from_secs(30);
    let holder = client(&backend, "holder")
        .lock("k")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let waiter = client(&backend, "waiter");
    let wait = tokio::spawn(async move {
        waiter
            .lock("k")
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    let tries = backend.attempts.lock().unwrap().len();
    holder.release().await.unwrap();
    let guard = wait.await.unwrap().unwrap();
    guard.release().await.unwrap();
    tries
}

#[tokio::test(start_paused = true)]
async fn a_complete_source_s_waiter_tries_once_a_second_and_is_woken_by_the_release() {
    let tries = tries_while_held(true).await;
    // The holder's try, the waiter's first, then one a second.
    assert!((11..=12).contains(&tries), "{tries} tries in 10 s");
}

#[tokio::test(start_paused = true)]
async fn a_best_effort_source_s_waiter_also_tries_on_its_backoff() {
    let tries = tries_while_held(false).await;
    // Backoff doubling from 1 ms to 1 s, each pause jittered below its
    // step: about thirty (34 measured).
    assert!(tries >= 16, "{tries} tries in 10 s");
}
