//! A 3-member ZooKeeper ensemble on loopback: several clients acquire and
//! release one key in a loop while the leader is killed. Checks that no two
//! grants overlap, that tokens (creation zxids) keep growing across the
//! leader change (the zxid epoch moves up with the new leader), and that
//! acquisition resumes once a new leader is elected.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};
use fencelock_testkit::{servers::zookeeper::ZkServer, TestResult};
use fencelock_zookeeper::ZkBackend;

const WORKERS: usize = 4;
const KEY: &str = "cluster-hot";

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    grants: AtomicU64,
    inside: AtomicUsize,
    overlaps: AtomicU64,
    tokens: Mutex<Vec<u64>>,
    errors: AtomicU64,
}

async fn worker(id: usize, url: String, shared: Arc<Shared>) -> TestResult {
    let backend = ZkBackend::connect(&url).await?;
    let key = LockKey::new(KEY)?;
    let owner = Owner::new(format!("worker-{id}"))?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(3));
    while !shared.stop.load(Ordering::SeqCst) {
        match backend.try_acquire(&request).await {
            Ok(Acquire::Granted(g)) => {
                if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    shared.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                shared
                    .tokens
                    .lock()
                    .map_err(|_| "poisoned")?
                    .push(g.token.0);
                shared.inside.fetch_sub(1, Ordering::SeqCst);
                shared.grants.fetch_add(1, Ordering::SeqCst);
                // A release lost to the failover leaves the lease to expire.
                if backend.release(&request.lease(g.token)).await.is_err() {
                    shared.errors.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(Acquire::Held(_)) => {
                let mut wake = backend.subscribe(&key).await.ok().flatten();
                if let Some(w) = wake.as_mut() {
                    let _ = tokio::time::timeout(Duration::from_millis(200), w.woken()).await;
                }
            }
            Err(e) if e.is_transient() => {
                shared.errors.fetch_add(1, Ordering::SeqCst);
                // Bounded pause while the ensemble elects a new leader.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn wait_for_grants(shared: &Shared, at_least: u64, bound: Duration) -> TestResult {
    let deadline = tokio::time::Instant::now() + bound;
    while shared.grants.load(Ordering::SeqCst) < at_least {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "only {} grants within {bound:?} (wanted {at_least})",
                shared.grants.load(Ordering::SeqCst)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_exclusion_and_token_order() -> TestResult {
    let ensemble = Arc::new(tokio::task::spawn_blocking(|| ZkServer::start_members(3)).await??);
    let url = format!("{}?prefix=cluster&timeout=2s", ensemble.url());
    let shared = Arc::new(Shared::default());
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(worker(i, url.clone(), Arc::clone(&shared))))
        .collect();

    wait_for_grants(&shared, 30, Duration::from_secs(30)).await?;
    let e = Arc::clone(&ensemble);
    let victim = tokio::task::spawn_blocking(move || e.leader())
        .await?
        .ok_or("no member says it leads")?;
    ensemble.kill(victim)?;
    let at_kill = shared.grants.load(Ordering::SeqCst);
    let errors_at_kill = shared.errors.load(Ordering::SeqCst);
    let killed_at = tokio::time::Instant::now();
    // Acquisition resumes once the two survivors elect a leader.
    wait_for_grants(&shared, at_kill + 1, Duration::from_secs(60)).await?;
    let resumed_after = killed_at.elapsed();
    wait_for_grants(&shared, at_kill + 30, Duration::from_secs(60)).await?;
    let steady_after = killed_at.elapsed();
    let e = Arc::clone(&ensemble);
    let new_leader = tokio::task::spawn_blocking(move || e.leader())
        .await?
        .ok_or("the survivors have no leader")?;
    assert_ne!(new_leader, victim);

    shared.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await??;
    }
    assert_eq!(
        shared.overlaps.load(Ordering::SeqCst),
        0,
        "two clients held the key at once"
    );
    let tokens = shared.tokens.lock().map_err(|_| "poisoned")?.clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not strictly grow in grant order"
    );
    // The zxid's high half is the leader's epoch: the grants after the
    // kill carry the new leader's.
    let epoch = |t: u64| t >> 32;
    assert!(
        epoch(tokens[tokens.len() - 1]) > epoch(tokens[0]),
        "no grant carries the new leader's epoch"
    );
    eprintln!(
        "{} grants ({} after killing leader {victim}); first grant {resumed_after:?} after the kill, \
         30 grants after {steady_after:?}; transient errors: {errors_at_kill} before, {} after; new leader {new_leader}",
        tokens.len(),
        tokens.len() as u64 - at_kill,
        shared.errors.load(Ordering::SeqCst) - errors_at_kill
    );
    Ok(())
}
