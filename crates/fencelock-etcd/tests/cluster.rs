//! A 3-member etcd cluster on loopback: several clients acquire and release
//! one key in a loop while the leader is killed. Checks that no two grants
//! overlap (client side and in the server's own history), that tokens keep
//! growing, and that acquisition resumes once a new leader is elected.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use etcd_client::{Client, EventType, WatchOptions};
use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{servers::etcd::EtcdCluster, TestResult};

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

/// The index of the member that is the current leader.
async fn leader(cluster: &EtcdCluster) -> TestResult<usize> {
    for i in 0..cluster.len() {
        let mut c = Client::connect([cluster.endpoint(i)], None).await?;
        let status = c.status().await?;
        let me = status.header().map(|h| h.member_id()).ok_or("no header")?;
        if status.leader() == me {
            return Ok(i);
        }
    }
    Err("no member says it is the leader".into())
}

async fn worker(id: usize, url: String, shared: Arc<Shared>) -> TestResult {
    let backend = EtcdBackend::connect(&url).await?;
    let key = LockKey::new(KEY)?;
    let owner = Owner::new(format!("worker-{id}"))?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(3));
    while !shared.stop.load(Ordering::SeqCst) {
        match backend.try_acquire(&request).await {
            Ok(Acquire::Granted(g)) => {
                if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    shared.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut tokens = shared.tokens.lock().map_err(|_| "poisoned")?;
                    tokens.push(g.token.0);
                }
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
                // Bounded pause while the cluster elects a new leader.
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
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start_members(3)).await??;
    let url = format!("{}?prefix=cluster&timeout=2s", cluster.url());
    let shared = Arc::new(Shared::default());
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(worker(i, url.clone(), Arc::clone(&shared))))
        .collect();

    wait_for_grants(&shared, 30, Duration::from_secs(30)).await?;
    let victim = leader(&cluster).await?;
    cluster.kill(victim)?;
    let at_kill = shared.grants.load(Ordering::SeqCst);
    let errors_at_kill = shared.errors.load(Ordering::SeqCst);
    let killed_at = tokio::time::Instant::now();
    // Acquisition resumes once the two survivors elect a leader.
    wait_for_grants(&shared, at_kill + 1, Duration::from_secs(60)).await?;
    let resumed_after = killed_at.elapsed();
    wait_for_grants(&shared, at_kill + 30, Duration::from_secs(60)).await?;
    let steady_after = killed_at.elapsed();
    let new_leader = leader_among_survivors(&cluster, victim).await?;
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

    // The server's own history of the key: every grant is a create (PUT at
    // version 1) and each is deleted before the next create, so no two
    // grants ever overlapped on the server.
    let mut client = Client::connect([cluster.endpoint((victim + 1) % 3)], None).await?;
    let full_key = format!("cluster/locks/{KEY}");
    let marker = client.put(full_key.clone(), "end", None).await?;
    let end = marker.header().map(|h| h.revision()).ok_or("no header")?;
    let mut watch = client
        .watch(full_key, Some(WatchOptions::new().with_start_revision(1)))
        .await?;
    let mut held: Option<i64> = None;
    let mut creates = Vec::new();
    'history: while let Some(resp) = watch.message().await? {
        for event in resp.events() {
            let kv = event.kv().ok_or("event without kv")?;
            if kv.mod_revision() >= end {
                break 'history;
            }
            match event.event_type() {
                EventType::Put => {
                    assert!(
                        held.is_none(),
                        "create at {} while {held:?} held",
                        kv.mod_revision()
                    );
                    assert_eq!(
                        kv.create_revision(),
                        kv.mod_revision(),
                        "a grant modified a live key"
                    );
                    held = Some(kv.create_revision());
                    creates.push(u64::try_from(kv.create_revision())?);
                }
                EventType::Delete => held = None,
            }
        }
    }
    for t in &tokens {
        assert!(
            creates.binary_search(t).is_ok(),
            "token {t} is not a create in the history"
        );
    }
    eprintln!(
        "{} grants ({} after killing leader m{victim}); first grant {resumed_after:?} after the kill, \
         30 grants after {steady_after:?}; transient errors: {errors_at_kill} before, {} after; new leader m{new_leader}",
        tokens.len(),
        tokens.len() as u64 - at_kill,
        shared.errors.load(Ordering::SeqCst) - errors_at_kill
    );
    Ok(())
}

async fn leader_among_survivors(cluster: &EtcdCluster, dead: usize) -> TestResult<usize> {
    for i in (0..cluster.len()).filter(|&i| i != dead) {
        let mut c = Client::connect([cluster.endpoint(i)], None).await?;
        let status = c.status().await?;
        let leader_id = status.leader();
        for j in (0..cluster.len()).filter(|&j| j != dead) {
            let mut cj = Client::connect([cluster.endpoint(j)], None).await?;
            let s = cj.status().await?;
            if s.header().map(|h| h.member_id()) == Some(leader_id) {
                return Ok(j);
            }
        }
    }
    Err("the survivors have no leader".into())
}
