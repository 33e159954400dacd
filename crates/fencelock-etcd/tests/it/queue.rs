//! The FIFO queue's entries (`src/queue.rs`, `docs/fairness.md`) against
//! a real etcd: a waiter's attempt that reaches etcd after its wait left the
//! queue does not put its entry back.
//!
//! Time: a real etcd. The late attempt's delay must outlast the leave sent
//! after it (else the test proves nothing), and the holder's lease the
//! test: both are scaled from a [`Patience`] measured against the direct
//! backend first (bases 2 s and 30 s); a failure names the budget.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, FairQueue, LockKey, Owner};
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{
    proxy::{Direction, ProxiedUrl},
    servers::etcd::EtcdCluster,
    Patience, TestResult,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_lands_after_the_wait_left_does_not_requeue() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let url = format!("{}?prefix=requeue", etcd.url());
    let proxied = ProxiedUrl::start(&url).await?;
    // The waiter talks through the proxy, everyone else directly.
    let waiter = EtcdBackend::connect(proxied.url()).await?;
    let direct = EtcdBackend::connect(&url).await?;
    let key = LockKey::new("k")?;
    let p = Patience::against(&direct).await;
    let ttl = p.ttl(Duration::from_secs(30));
    let holder = AcquireRequest::new(key.clone(), Owner::new("holder")?, ttl);
    assert!(
        matches!(direct.try_acquire(&holder).await?, Acquire::Granted(_)),
        "the holder's grant"
    );
    let owner = Owner::new("waiter")?;
    let attempt = AcquireRequest::new(key.clone(), owner.clone(), ttl).with_queue(true);
    assert!(
        matches!(waiter.try_acquire(&attempt).await?, Acquire::Held(_)),
        "the waiter's first attempt"
    );
    assert!(
        direct.queue(&key).await?.len() == 1,
        "the waiter has no entry"
    );

    // The waiter's next attempt is on its way when its wait leaves (as
    // when a dropped wait's leave overtakes its last attempt): it reaches
    // etcd seconds later.
    proxied.set_latency(
        Direction::ToServer,
        p.bound(Duration::from_secs(2)),
        Duration::ZERO,
    );
    let late = tokio::spawn(async move {
        let answer = waiter.try_acquire(&attempt).await;
        (waiter, answer)
    });
    direct.leave_queue(&key, &owner).await?;
    assert!(
        !late.is_finished(),
        "the late attempt was answered before the leave: the test proves nothing [{p}]"
    );
    let (_waiter, answer) = late.await?;
    assert!(matches!(answer?, Acquire::Held(_)), "the late attempt");
    let left = direct.queue(&key).await?;
    assert!(
        left.is_empty(),
        "the late attempt put the entry back after the wait left: {left:?}"
    );
    Ok(())
}
