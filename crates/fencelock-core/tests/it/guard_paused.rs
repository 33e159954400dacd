//! Guard and waiting behaviour with a paused tokio clock: renewal cadence,
//! loss before the backend's expiry, retries, wake-ups, deadlines. The memory
//! backend keeps time on the same (paused) clock, so these are exact.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    fault::{Fault, FaultyBackend},
    Acquire, AcquireRequest, Backend, BackendAdmin, ClockPolicy, Error, LockClient, LockKey,
    LossReason, MemoryBackend, Owner,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn client(backend: Arc<dyn Backend>, owner: &str) -> LockClient {
    LockClient::builder(backend)
        .owner(Owner::new(owner).expect("valid owner"))
        .build()
        .expect("valid client")
}

fn key(k: &str) -> LockKey {
    LockKey::new(k).expect("valid key")
}

/// Renewals are jittered up to a tenth of their period early, so `elapsed`
/// holds between `elapsed / period` and `elapsed / (0.9 · period)` of them.
fn assert_renewals(count: usize, elapsed: Duration, period: Duration) {
    let fewest = (elapsed.as_secs_f64() / period.as_secs_f64()).floor() as usize;
    let most = (elapsed.as_secs_f64() / period.mul_f64(0.9).as_secs_f64()).floor() as usize;
    assert!(
        (fewest..=most).contains(&count),
        "{count} renewals in {elapsed:?} with a {period:?} period"
    );
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(95)).await;
    // Renewals about every 10 s.
    assert_renewals(faulty.renew_calls(), Duration::from_secs(95), TTL / 3);
    assert!(guard.is_valid());
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn custom_renewal_period_is_honoured() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .renew_every(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert_renewals(
        faulty.renew_calls(),
        Duration::from_secs(21),
        Duration::from_secs(2),
    );
    drop(guard);
}

#[tokio::test(start_paused = true)]
async fn unreachable_backend_is_a_loss_before_the_lease_ends() {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = FaultyBackend::new(memory.clone());
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let granted = Instant::now();
    faulty.set(Fault::Hang);
    let reason = guard.lost().await;
    let lost_after = granted.elapsed();
    assert_eq!(reason, LossReason::Deadline);
    // The guard gave up at its conservative deadline …
    assert_eq!(lost_after, ClockPolicy::default().valid_for(TTL));
    // … while the backend still had the lease: nobody else could hold it yet.
    let lease = memory
        .inspect(&key("k"))
        .await
        .unwrap()
        .expect("lease still live");
    assert!(lease.expires_in > Duration::ZERO);
    assert!(!guard.is_valid());
    assert!(matches!(guard.check(), Err(Error::LockLost { .. })));
}

#[tokio::test(start_paused = true)]
async fn refused_connections_are_retried_until_the_deadline() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    faulty.set(Fault::Refuse);
    let reason = guard.lost().await;
    assert_eq!(reason, LossReason::Deadline);
    // Backoff retries between the first failed renewal (10 s) and the deadline.
    assert!(
        faulty.renew_calls() > 5,
        "only {} renew attempts",
        faulty.renew_calls()
    );
}

#[tokio::test(start_paused = true)]
async fn a_transient_outage_shorter_than_the_lease_is_survived() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    faulty.set(Fault::Refuse);
    tokio::time::sleep(Duration::from_secs(15)).await;
    faulty.set(Fault::None);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(guard.is_valid());
    assert_eq!(guard.loss_reason(), None);
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn force_release_is_noticed_at_the_next_renewal() {
    let memory = Arc::new(MemoryBackend::new());
    let guard = client(memory.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let t0 = Instant::now();
    memory
        .force_release(&key("k"))
        .await
        .unwrap()
        .expect("held");
    assert_eq!(guard.lost().await, LossReason::Refused);
    // Renewals are jittered up to a tenth of the period early.
    let noticed = t0.elapsed();
    assert!(
        noticed <= TTL / 3 && noticed >= (TTL / 3).mul_f64(0.9),
        "noticed after {noticed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_auto_renew_the_guard_still_signals_its_deadline() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(guard.lost().await, LossReason::Deadline);
    assert_eq!(t0.elapsed(), ClockPolicy::default().valid_for(TTL));
    assert_eq!(faulty.renew_calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn manual_renew_extends_the_deadline() {
    let memory = Arc::new(MemoryBackend::new());
    let guard = client(memory, "a")
        .lock("k")
        .ttl(TTL)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    guard.renew().await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        guard.is_valid(),
        "40 s after the grant, 20 s after a renewal"
    );
    assert_eq!(
        guard.remaining(),
        ClockPolicy::default().valid_for(TTL) - Duration::from_secs(20)
    );
}

#[tokio::test(start_paused = true)]
async fn with_lock_drops_the_closure_when_lost() {
    let memory = Arc::new(MemoryBackend::new());
    let c = client(memory.clone(), "a");
    let admin = memory.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        admin.force_release(&key("k")).await.unwrap();
    });
    let result = c
        .lock("k")
        .ttl(TTL)
        .run(|_guard| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "finished"
        })
        .await;
    assert!(
        matches!(
            result,
            Err(Error::LockLost {
                reason: LossReason::Refused,
                ..
            })
        ),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_the_release_not_by_its_backoff() {
    let memory = Arc::new(MemoryBackend::new());
    let holder = client(memory.clone(), "holder")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let waiter = client(memory.clone(), "waiter");
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock("k")
            .ttl(TTL)
            .wait(Duration::from_secs(60))
            .acquire()
            .await;
        (guard, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(7)).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (guard, acquired_at) = waiting.await.unwrap();
    guard.unwrap().release().await.unwrap();
    // On the paused clock, a backoff sleep would have advanced time.
    assert_eq!(acquired_at, released_at);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_never_sleeps_past_the_holders_expiry() {
    let memory = Arc::new(MemoryBackend::new());
    // A holder that crashed right after its grant: no client renews or
    // releases it, its lease just ends.
    let crashed = AcquireRequest::new(
        key("k"),
        Owner::new("crashed").unwrap(),
        Duration::from_secs(10),
    );
    assert!(matches!(
        memory.try_acquire(&crashed).await.unwrap(),
        Acquire::Granted(_)
    ));
    let t0 = Instant::now();
    let guard = client(memory, "waiter")
        .lock("k")
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited <= Duration::from_millis(10_001),
        "{waited:?}"
    );
    drop(guard);
}

#[tokio::test(start_paused = true)]
async fn waiting_honours_the_deadline() {
    let memory = Arc::new(MemoryBackend::new());
    let _holder = client(memory.clone(), "holder")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let t0 = Instant::now();
    let result = client(memory, "waiter")
        .lock("k")
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_backend_does_not_hang_acquire() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    faulty.set(Fault::Hang);
    let c = LockClient::builder(faulty)
        .op_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let result = c.lock("k").acquire().await;
    assert!(matches!(&result, Err(e) if e.is_transient()), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn a_detached_lease_stays_until_released_by_owner_and_token() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let (owner, token) = (guard.owner().clone(), guard.token());
    guard.detach();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(faulty.renew_calls(), 0, "a detached guard renewed");
    let lease = faulty
        .inspect(&key("k"))
        .await
        .unwrap()
        .expect("not released on detach");
    assert_eq!(lease.token, token);
    faulty
        .release(&fencelock_core::LeaseId::new(key("k"), owner, token))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn waiting_forever_is_allowed() {
    let memory = Arc::new(MemoryBackend::new());
    let holder = client(memory.clone(), "holder")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    let waiter = client(memory, "waiter");
    let waiting = tokio::spawn(async move { waiter.lock("k").wait(Duration::MAX).acquire().await });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    holder.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_manual_renew_against_a_hung_backend_comes_back() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    faulty.set(Fault::Hang);
    let renewed = guard.renew().await;
    assert!(
        matches!(&renewed, Err(e) if e.is_transient()),
        "{renewed:?}"
    );
    // Bounded by a third of the TTL, well inside the lease.
    assert!(guard.is_valid());
}

/// A grant whose answer arrives after the guard would stop trusting it
/// (29.2 s of a 30 s lease) is handed back at once, and `acquire` fails
/// instead of returning a guard lost at birth; with a wait it keeps trying
/// until the deadline.
#[tokio::test(start_paused = true)]
async fn a_grant_that_answers_too_late_is_given_back() {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = FaultyBackend::new(memory.clone());
    faulty.set_reply_delay(Duration::from_millis(29_500));
    // Patient enough to hear the late answers.
    let slow_client = |backend: Arc<FaultyBackend>| {
        LockClient::builder(backend)
            .owner(Owner::new("a").unwrap())
            .op_timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let c = slow_client(faulty.clone());
    let attempt = tokio::spawn(async move { c.lock("k").ttl(TTL).acquire().await });
    // The grant was made at 0 s and would last until 30 s; its answer came
    // at 29.5 s and the release went out then.
    tokio::time::sleep(Duration::from_millis(29_600)).await;
    assert!(memory.inspect(&key("k")).await.unwrap().is_none());
    let result = attempt.await.unwrap();
    assert!(matches!(&result, Err(e) if e.is_transient()), "{result:?}");

    let c = slow_client(faulty.clone());
    let started = Instant::now();
    let waited = c
        .lock("k")
        .ttl(TTL)
        .wait(Duration::from_secs(100))
        .acquire()
        .await;
    assert!(matches!(&waited, Err(e) if e.is_transient()), "{waited:?}");
    assert!(started.elapsed() >= Duration::from_secs(100));

    faulty.set_reply_delay(Duration::from_millis(29_000));
    let guard = slow_client(faulty)
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_valid());
}

/// One renewer per client: leases taken together are renewed together, in
/// one `renew_many` batch per renewal period, not one call per lease.
#[tokio::test(start_paused = true)]
async fn leases_due_together_are_renewed_in_one_batch() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let client = client(faulty.clone(), "a");
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(
            client
                .lock(format!("k{i}"))
                .ttl(TTL)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Three renewal periods.
    tokio::time::sleep(TTL).await;
    assert!(guards.iter().all(|g| g.is_valid()));
    assert_eq!(
        faulty.renew_calls(),
        150,
        "each lease renewed once a period"
    );
    assert_eq!(faulty.renew_batches(), 3, "one batch a period");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// `close` releases every lease of the client and its clones, tells each
/// guard why, and refuses new acquisitions.
#[tokio::test(start_paused = true)]
async fn close_releases_every_lease_and_refuses_new_ones() {
    let memory = Arc::new(MemoryBackend::new());
    let client = client(memory.clone(), "a");
    let clone = client.clone();
    let a = client.lock("a").ttl(TTL).acquire().await.unwrap();
    let b = clone.lock("b").ttl(TTL).acquire().await.unwrap();
    let running = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("c")
                .ttl(TTL)
                .run(|_| std::future::pending::<()>())
                .await
        }
    });
    while memory.inspect(&key("c")).await.unwrap().is_none() {
        tokio::task::yield_now().await;
    }
    client.close().await.unwrap();
    for k in ["a", "b", "c"] {
        assert_eq!(
            memory.inspect(&key(k)).await.unwrap(),
            None,
            "{k} still held"
        );
    }
    assert_eq!(a.loss_reason(), Some(LossReason::Closed));
    assert!(!b.is_valid());
    assert!(matches!(
        running.await.unwrap(),
        Err(fencelock_core::Error::LockLost {
            reason: LossReason::Closed,
            ..
        })
    ));
    a.release().await.unwrap();
    drop(b);
    assert!(matches!(
        clone.lock("d").acquire().await,
        Err(fencelock_core::Error::ClientClosed)
    ));
}

/// A guard lost at its local deadline (renewals unanswered, not refused)
/// hands its lease back once the backend answers again, so the next holder
/// need not wait out the TTL.
#[tokio::test(start_paused = true)]
async fn a_lease_lost_at_the_deadline_is_handed_back() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let guard = client(faulty.clone(), "a")
        .lock("k")
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    // Renewals fail with a quick transient error until the deadline; the
    // hand-back after the loss goes through.
    faulty.set(Fault::RefuseRenewals);
    assert_eq!(guard.lost().await, LossReason::Deadline);
    // The lease itself would end 0.8 s after the loss (the trusted window
    // is 29.2 s of 30 s); the hand-back must come well before that.
    let deadline = Instant::now() + Duration::from_millis(200);
    while faulty.inspect(&key("k")).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the lost lease was not handed back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        matches!(guard.release().await, Err(Error::NotHeld { .. })),
        "a handed-back lease is not held"
    );
}

/// One task per client, not per lock: a client's renewer task lives while
/// the client does (lock cycles spawn nothing), and ends once the client and
/// its last guard are gone.
#[tokio::test(start_paused = true)]
async fn one_renewer_task_per_client_for_its_lifetime() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let memory = Arc::new(MemoryBackend::new());
    let client = client(memory, "a");
    for _ in 0..100 {
        let guard = client.lock("k").ttl(TTL).acquire().await.unwrap();
        guard.release().await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(metrics.num_alive_tasks(), 1, "the client's renewer only");
    let kept = client.lock("kept").ttl(TTL).acquire().await.unwrap();
    drop(client);
    // A guard that outlives its client is still renewed.
    tokio::time::sleep(TTL * 2).await;
    assert!(kept.is_valid());
    kept.release().await.unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        metrics.num_alive_tasks(),
        0,
        "the renewer outlived its client"
    );
}
