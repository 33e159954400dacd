//! Resharding: shard `b` joins shard `a` through the two transition steps
//! of docs/sharding.md, with processes on adjacent steps running at once.
//! Memory shards, shared by URL between the "processes" (one
//! `ShardedBackend` per map, as each process would open its own).

mod common;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use fencelock_core::{Acquire, AcquireRequest, Backend, FencingToken, LockKey, Owner};
use fencelock_sharded::{Phase, Shard, ShardMap, ShardedBackend};
use fencelock_testkit::TestResult;
use rand::Rng;

const TTL: Duration = Duration::from_secs(60);

/// The four maps of the move, in order, over shards at `urls` (a, b).
fn steps(urls: [&str; 2]) -> TestResult<Vec<ShardMap>> {
    let a = Shard::new("a", urls[0]);
    let b = Shard::new("b", urls[1]);
    let before = ShardMap::new(1, vec![a.clone()])?;
    let after = |epoch| ShardMap::new(epoch, vec![a.clone(), b.clone()]);
    Ok(vec![
        before,
        after(2)?.in_transition(Phase::Join, vec![a.clone()])?,
        after(3)?.in_transition(Phase::Handover, vec![a.clone()])?,
        after(4)?,
    ])
}

async fn open_all(maps: Vec<ShardMap>) -> TestResult<Vec<Arc<dyn Backend>>> {
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for map in maps {
        backends.push(Arc::new(ShardedBackend::open(map, common::open).await?));
    }
    Ok(backends)
}

fn request(key: &str, owner: &str) -> TestResult<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockKey::new(key)?,
        Owner::new(owner)?,
        TTL,
    ))
}

/// Keys of `candidates` that shard `b` wins once it has joined: found on
/// a separate pair of shards with the same names (routing depends on names
/// only), so the stores under test see no probe.
async fn moving_keys(tag: &str, count: usize) -> TestResult<Vec<String>> {
    let b_url = format!("mem://{tag}-probe-b");
    let probe = ShardedBackend::open(
        ShardMap::new(
            1,
            vec![
                Shard::new("a", format!("mem://{tag}-probe-a")),
                Shard::new("b", b_url.clone()),
            ],
        )?,
        common::open,
    )
    .await?;
    let b = common::open(b_url).await?;
    let mut moving = Vec::new();
    for i in 0.. {
        let key = format!("{tag}:{i}");
        let Acquire::Granted(_) = probe.try_acquire(&request(&key, "probe")?).await? else {
            return Err(format!("probe {key} not granted").into());
        };
        if b.inspect(&LockKey::new(key.as_str())?).await?.is_some() {
            moving.push(key);
        }
        if moving.len() == count {
            break;
        }
    }
    Ok(moving)
}

async fn grant(backend: &dyn Backend, key: &str, owner: &str) -> TestResult<FencingToken> {
    match backend.try_acquire(&request(key, owner)?).await? {
        Acquire::Granted(g) => Ok(g.token),
        held => Err(format!("{key} not granted to {owner}: {held:?}").into()),
    }
}

/// One moving key, granted and released by each step after its neighbours
/// in both orders: every token is above all before it, and a holder on one
/// step keeps out the adjacent steps.
#[tokio::test]
async fn adjacent_steps_keep_exclusion_and_token_order() -> TestResult {
    let key = moving_keys("seq", 1).await?.remove(0);
    let steps = open_all(steps(["mem://seq-a", "mem://seq-b"])?).await?;
    let mut last = FencingToken(0);
    for order in [0, 1, 0, 2, 1, 3, 2, 3] {
        let token = grant(&*steps[order], &key, "o").await?;
        assert!(token > last, "step {order} gave {token} after {last}");
        last = token;
        for neighbour in [order.wrapping_sub(1), order + 1] {
            if let Some(other) = steps.get(neighbour) {
                let rival = other.try_acquire(&request(&key, "rival")?).await?;
                assert!(
                    matches!(rival, Acquire::Held(_)),
                    "step {neighbour} got the key step {order} holds: {rival:?}"
                );
            }
        }
        let info = steps[order]
            .inspect(&LockKey::new(key.as_str())?)
            .await?
            .ok_or("no holder")?;
        steps[order]
            .release(&fencelock_core::LeaseId::new(info.key, info.owner, token))
            .await?;
    }
    Ok(())
}

/// What the transition steps are for: a map that jumps from `a` alone to
/// `a` and `b`, while processes of the old map still run, lets two holders
/// have a moving key at once.
#[tokio::test]
async fn skipping_the_transition_breaks_exclusion() -> TestResult {
    let key = moving_keys("skip", 1).await?.remove(0);
    let steps = open_all(steps(["mem://skip-a", "mem://skip-b"])?).await?;
    grant(&*steps[0], &key, "old").await?;
    let jumped = steps[3].try_acquire(&request(&key, "new")?).await?;
    assert!(
        matches!(jumped, Acquire::Granted(_)),
        "expected the unsafe jump to double-grant: {jumped:?}"
    );
    Ok(())
}

/// Per key: who holds it by the test's own account, and the last token.
struct Ledger {
    holder: Option<FencingToken>,
    last: FencingToken,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            holder: None,
            last: FencingToken(0),
        }
    }
}

/// Concurrent acquirers on random keys (most of them moving) while the map
/// goes through its four steps; at any moment each acquirer uses the
/// current step or the one before, as during a rolling deployment. No key
/// is ever granted while the ledger says it is held, and tokens only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_while_the_map_changes() -> TestResult {
    const WORKERS: usize = 8;
    const GRANTS_PER_STEP: usize = 300;
    let mut keys = moving_keys("run", 4).await?;
    keys.extend(["run:stays-a".to_owned(), "run:stays-b".to_owned()]);
    let steps = Arc::new(open_all(steps(["mem://run-a", "mem://run-b"])?).await?);
    let ledger: Arc<HashMap<String, Mutex<Ledger>>> =
        Arc::new(keys.iter().map(|k| (k.clone(), Mutex::default())).collect());
    let grants = Arc::new(AtomicUsize::new(0));
    let per_step = Arc::new(Mutex::new([0usize; 4]));
    // Set by a worker that found a violation, so that the others (which
    // may wait on the key it keeps) stop too.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let total = GRANTS_PER_STEP * steps.len();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (steps, ledger, grants, keys) = (
            Arc::clone(&steps),
            Arc::clone(&ledger),
            Arc::clone(&grants),
            keys.clone(),
        );
        let per_step = Arc::clone(&per_step);
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let owner = format!("w{w}");
            let run = async {
                while grants.load(Ordering::SeqCst) < total && !stop.load(Ordering::SeqCst) {
                    let (step, key) = {
                        let mut rng = rand::thread_rng();
                        let newest = (grants.load(Ordering::SeqCst) / GRANTS_PER_STEP).min(3);
                        let step = newest.saturating_sub(usize::from(rng.gen_bool(0.5)));
                        (step, keys[rng.gen_range(0..keys.len())].clone())
                    };
                    let backend = &steps[step];
                    let Acquire::Granted(g) = backend.try_acquire(&request(&key, &owner)?).await?
                    else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    {
                        let mut entry = ledger[&key].lock().map_err(|_| "poisoned")?;
                        if let Some(holder) = entry.holder {
                            return Err(format!(
                                "{key} granted {} on step {step} while {holder} held it",
                                g.token
                            )
                            .into());
                        }
                        if g.token <= entry.last {
                            return Err(format!(
                                "{key}: token {} on step {step} after {}",
                                g.token, entry.last
                            )
                            .into());
                        }
                        entry.holder = Some(g.token);
                        entry.last = g.token;
                    }
                    per_step.lock().map_err(|_| "poisoned")?[step] += 1;
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    ledger[&key].lock().map_err(|_| "poisoned")?.holder = None;
                    let lease = fencelock_core::LeaseId::new(
                        LockKey::new(key.as_str())?,
                        Owner::new(owner.as_str())?,
                        g.token,
                    );
                    backend.release(&lease).await?;
                    grants.fetch_add(1, Ordering::SeqCst);
                }
                TestResult::Ok(())
            };
            let result = run.await;
            if result.is_err() {
                stop.store(true, Ordering::SeqCst);
            }
            result
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let per_step = *per_step.lock().map_err(|_| "poisoned")?;
    assert!(
        per_step.iter().all(|n| *n > 0),
        "a step never granted: {per_step:?}"
    );
    Ok(())
}
