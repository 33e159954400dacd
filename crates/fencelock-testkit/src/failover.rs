//! Exclusion and token order across the death of a replicated store's
//! leader: clients acquire and release one key in a loop while the leader
//! is killed with SIGKILL. One run, shared by every clustered backend's
//! test (etcd, ZooKeeper); each adds the checks only its engine can make
//! (the server's own history on etcd, the zxid epoch on ZooKeeper).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};

use crate::{patience::Patience, TestResult};

/// Clients acquiring and releasing the key at once.
const WORKERS: usize = 4;
/// Grants before the kill, and again after acquisition resumed.
const GRANTS: u64 = 30;
/// How long each batch of grants may take, the survivors' election
/// included, as the base of the run's measured budget.
const GRANTS_WITHIN: Duration = Duration::from_secs(60);
/// The workers' lease, as the base of the run's measured budget: it must
/// not end between a grant and its release, or two workers would overlap
/// although the store is right.
const WORKER_TTL: Duration = Duration::from_secs(3);

/// A boxed future, as the engine-specific hooks return.
pub type Hook<'a, T> = Pin<Box<dyn Future<Output = TestResult<T>> + Send + 'a>>;

/// What a clustered store's test supplies.
pub trait Ensemble: Send + Sync {
    /// Opens one client's backend (each worker has its own connections).
    fn open(&self) -> Hook<'_, Arc<dyn Backend>>;
    /// The member that leads now, leaving out `dead` if given.
    fn leader(&self, dead: Option<usize>) -> Hook<'_, usize>;
    /// Kills `member` with SIGKILL.
    fn kill(&self, member: usize) -> TestResult;
}

/// What a run saw, for the engine's own checks and its report.
#[derive(Debug)]
pub struct Failover {
    /// Every grant's token, in grant order (already checked to strictly grow).
    pub tokens: Vec<u64>,
    /// The key the clients took.
    pub key: LockKey,
    /// The killed leader.
    pub victim: usize,
    /// The member leading after the kill.
    pub new_leader: usize,
    /// Grants before the kill.
    pub at_kill: u64,
    /// From the kill to the first grant after it.
    pub resumed_after: Duration,
    /// From the kill to as many grants after it as before it.
    pub steady_after: Duration,
    /// Transient errors before the kill.
    pub errors_before: u64,
    /// Transient errors after the kill.
    pub errors_after: u64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    grants: AtomicU64,
    inside: AtomicUsize,
    overlaps: AtomicU64,
    tokens: Mutex<Vec<u64>>,
    errors: AtomicU64,
}

/// Runs the clients, kills the leader once they are granting, waits until
/// they grant again, and checks that no two grants overlapped and that
/// tokens strictly grew in grant order.
pub async fn leader_failover(ensemble: Arc<dyn Ensemble>, key: &str) -> TestResult<Failover> {
    let key = LockKey::new(key)?;
    let shared = Arc::new(Shared::default());
    let mut backends = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        backends.push(ensemble.open().await?);
    }
    let patience = Patience::against(&*backends[0]).await;
    let tasks: Vec<_> = backends
        .into_iter()
        .enumerate()
        .map(|(id, backend)| {
            tokio::spawn(worker(
                id,
                backend,
                key.clone(),
                patience.ttl(WORKER_TTL),
                Arc::clone(&shared),
            ))
        })
        .collect();
    let within = patience.bound(GRANTS_WITHIN);

    wait_for_grants(&shared, GRANTS, within).await?;
    let victim = ensemble.leader(None).await?;
    ensemble.kill(victim)?;
    let at_kill = shared.grants.load(Ordering::SeqCst);
    let errors_before = shared.errors.load(Ordering::SeqCst);
    let killed_at = tokio::time::Instant::now();
    // Acquisition resumes once the survivors elect a leader.
    wait_for_grants(&shared, at_kill + 1, within).await?;
    let resumed_after = killed_at.elapsed();
    wait_for_grants(&shared, at_kill + GRANTS, within).await?;
    let steady_after = killed_at.elapsed();
    let new_leader = ensemble.leader(Some(victim)).await?;

    shared.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await??;
    }
    let overlaps = shared.overlaps.load(Ordering::SeqCst);
    if overlaps != 0 {
        return Err(format!("two clients held the key at once ({overlaps} times)").into());
    }
    let tokens = shared.tokens.lock().map_err(|_| "poisoned")?.clone();
    if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!("tokens did not strictly grow in grant order: {w:?}").into());
    }
    if new_leader == victim {
        return Err(format!("member {victim} still leads after it was killed").into());
    }
    Ok(Failover {
        tokens,
        key,
        victim,
        new_leader,
        at_kill,
        resumed_after,
        steady_after,
        errors_before,
        errors_after: shared.errors.load(Ordering::SeqCst) - errors_before,
    })
}

impl std::fmt::Display for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} grants ({} after killing leader {}); first grant {:?} after the kill, \
             {GRANTS} grants after {:?}; transient errors: {} before, {} after; new leader {}",
            self.tokens.len(),
            self.tokens.len() as u64 - self.at_kill,
            self.victim,
            self.resumed_after,
            self.steady_after,
            self.errors_before,
            self.errors_after,
            self.new_leader
        )
    }
}

async fn worker(
    id: usize,
    backend: Arc<dyn Backend>,
    key: LockKey,
    ttl: Duration,
    shared: Arc<Shared>,
) -> TestResult {
    let owner = Owner::new(format!("worker-{id}"))?;
    let request = AcquireRequest::new(key.clone(), owner, ttl);
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
                // Bounded pause while the survivors elect a new leader.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn wait_for_grants(shared: &Shared, at_least: u64, within: Duration) -> TestResult {
    let deadline = tokio::time::Instant::now() + within;
    while shared.grants.load(Ordering::SeqCst) < at_least {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "only {} grants within {within:?} (wanted {at_least})",
                shared.grants.load(Ordering::SeqCst)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
