//! Resharding: shard `b` joins shard `a` through the two transition steps
//! of docs/sharding.md, with processes on adjacent steps running at once.
//! Memory shards, shared by URL between the "processes" (one
//! `ShardedBackend` per map, as each process would open its own).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, FencingToken, LockKey, Owner,
};
use fencelock_sharded::{Phase, Placement, Shard, ShardMap, ShardedBackend};
use fencelock_testkit::TestResult;
use rand::Rng;

use crate::common;

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

/// The four maps of moving the keys starting with `prefix` from shard `a`
/// to shard `b` (at `urls`) by changing their placement rule: both shards
/// in every step, only the rule differs (docs/sharding.md, "Placement").
fn home_steps(urls: [&str; 2], prefix: &str) -> TestResult<Vec<ShardMap>> {
    let shards = vec![Shard::new("a", urls[0]), Shard::new("b", urls[1])];
    let on = |shard: &str| vec![Placement::prefix(prefix, shard)];
    let map = |epoch, shard| ShardMap::new(epoch, shards.clone())?.with_placement(on(shard));
    Ok(vec![
        map(1, "a")?,
        map(2, "b")?.in_transition_placed(Phase::Join, shards.clone(), on("a"))?,
        map(3, "b")?.in_transition_placed(Phase::Handover, shards.clone(), on("a"))?,
        map(4, "b")?,
    ])
}

/// The processes of each step, opened on first use: a step's backend
/// records its epoch on the shards when it opens, after which a step two
/// behind is refused (docs/sharding.md, "Adjacent steps only"), so a test
/// opens a step only when the rolling deployment it plays would.
struct Steps {
    maps: Vec<ShardMap>,
    opened: Vec<tokio::sync::OnceCell<Arc<dyn Backend>>>,
}

impl Steps {
    fn new(maps: Vec<ShardMap>) -> Self {
        let opened = maps.iter().map(|_| tokio::sync::OnceCell::new()).collect();
        Self { maps, opened }
    }

    fn len(&self) -> usize {
        self.maps.len()
    }

    /// Step `i`'s backend, opened now if it was not yet.
    async fn get(&self, i: usize) -> TestResult<&Arc<dyn Backend>> {
        let map = self.maps.get(i).ok_or("no such step")?.clone();
        Ok(self.opened[i]
            .get_or_try_init::<fencelock_core::Error, _, _>(|| async move {
                let backend: Arc<dyn Backend> =
                    Arc::new(ShardedBackend::open(map, common::open).await?);
                Ok(backend)
            })
            .await?)
    }
}

/// Whether `e` is the refusal of a step too far from one the shards saw.
fn is_epoch_refusal(e: &fencelock_core::Error) -> bool {
    matches!(e, fencelock_core::Error::InvalidArgument(msg)
        if msg.contains("only adjacent steps may run together"))
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
/// step keeps out the adjacent steps. A neighbour is tried only while the
/// shards let it run: the newer one only when the rest of the sequence no
/// longer needs the step two behind it (opening it retires that step),
/// and an older one that has been retired is refused by the epoch check.
#[tokio::test]
async fn adjacent_steps_keep_exclusion_and_token_order() -> TestResult {
    let key = moving_keys("seq", 1).await?.remove(0);
    let steps = Steps::new(steps(["mem://seq-a", "mem://seq-b"])?);
    steps_in_both_orders(&steps, &key).await
}

/// A key homed on `a` by its placement rule, moved to `b` by changing the
/// rule through the same four steps (the hashing alone keeps it on `a`):
/// exclusion and token order hold as for a key the hashing moves, and the
/// key lives on `a` before the move and on `b` after it.
#[tokio::test]
async fn a_homed_key_moves_with_its_rule_through_the_steps() -> TestResult {
    let hashed = ShardMap::new(
        1,
        vec![Shard::new("a", "mem://"), Shard::new("b", "mem://")],
    )?;
    let key = (0..)
        .map(|i| format!("thread:east:{i}"))
        .find(|k| hashed.owner(k).name == "a")
        .ok_or("no key")?;
    let urls = ["mem://home-a", "mem://home-b"];
    let steps = Steps::new(home_steps(urls, "thread:east:")?);
    let k = LockKey::new(key.as_str())?;
    for (step, on, off) in [(0, urls[0], urls[1]), (3, urls[1], urls[0])] {
        let token = grant(&**steps.get(step).await?, &key, "home").await?;
        let stored = |url: &str| {
            let k = k.clone();
            let url = url.to_owned();
            async move { TestResult::Ok(common::open(url).await?.inspect(&k).await?) }
        };
        assert!(stored(on).await?.is_some(), "step {step}: not on {on}");
        assert!(stored(off).await?.is_none(), "step {step}: on {off}");
        let lease = fencelock_core::LeaseId::new(k.clone(), Owner::new("home")?, token);
        steps.get(step).await?.release(&lease).await?;
        if step == 0 {
            steps_in_both_orders(&steps, &key).await?;
        }
    }
    Ok(())
}

/// Grants `key` on the steps of `steps` in the order 1,2,1,3,2,4,3,4 (see
/// [`adjacent_steps_keep_exclusion_and_token_order`]).
async fn steps_in_both_orders(steps: &Steps, key: &str) -> TestResult {
    let key = key.to_owned();
    let sequence = [0, 1, 0, 2, 1, 3, 2, 3];
    let mut newest = 0;
    let mut last = FencingToken(0);
    for (i, &order) in sequence.iter().enumerate() {
        newest = newest.max(order);
        let token = grant(&**steps.get(order).await?, &key, "o").await?;
        assert!(token > last, "step {order} gave {token} after {last}");
        last = token;
        let rest_from = sequence[i + 1..].iter().min().copied().unwrap_or(order);
        for neighbour in [order.wrapping_sub(1), order + 1] {
            if neighbour >= steps.len() || (neighbour > newest && rest_from < order) {
                continue;
            }
            newest = newest.max(neighbour);
            let rival = steps
                .get(neighbour)
                .await?
                .try_acquire(&request(&key, "rival")?)
                .await;
            match rival {
                Ok(Acquire::Held(_)) => {}
                Err(e) if neighbour + 2 <= newest && is_epoch_refusal(&e) => {}
                other => {
                    return Err(format!(
                        "step {neighbour} got the key step {order} holds: {other:?}"
                    )
                    .into())
                }
            }
        }
        let info = steps
            .get(order)
            .await?
            .inspect(&LockKey::new(key.as_str())?)
            .await?
            .ok_or("no holder")?;
        assert_eq!(info.token, token, "step {order} reads another token");
        steps
            .get(order)
            .await?
            .release(&fencelock_core::LeaseId::new(info.key, info.owner, token))
            .await?;
    }
    Ok(())
}

/// A lease granted on each step is read with the same token, renewed and
/// released from a process on the next step (the issue: "not held by …
/// with token 2"), and a lease of the old map survives two renewals on the
/// way: on `join`, which takes its missing half on the new shard, then on
/// `handover`.
#[tokio::test]
async fn a_lease_of_one_step_is_renewed_and_released_on_the_next() -> TestResult {
    let keys = moving_keys("next", 3).await?;
    let steps = Steps::new(steps(["mem://next-a", "mem://next-b"])?);
    for (from, key) in keys.iter().enumerate() {
        let to = from + 1;
        let k = LockKey::new(key.as_str())?;
        let token = grant(&**steps.get(from).await?, key, "holder").await?;
        let on_from = steps.get(from).await?.inspect(&k).await?.ok_or("free")?;
        let on_to = steps.get(to).await?.inspect(&k).await?.ok_or("free")?;
        assert_eq!(
            (on_from.token, on_to.token),
            (token, token),
            "steps {from} and {to} read different tokens"
        );
        let lease = fencelock_core::LeaseId::new(k.clone(), Owner::new("holder")?, token);
        let renewed = steps.get(to).await?.renew(&lease, TTL).await?;
        assert_eq!(renewed.token, token);
        // Still held against both steps after the renewal.
        for step in [from, to] {
            let rival = steps
                .get(step)
                .await?
                .try_acquire(&request(key, "rival")?)
                .await?;
            assert!(matches!(rival, Acquire::Held(_)), "step {step}: {rival:?}");
        }
        steps.get(to).await?.release(&lease).await?;
        // The new map (step 4) knows nothing of the old shard: a lease of
        // `handover` released there leaves its old-shard half to run out
        // by its TTL, so `handover` processes still see it until then.
        let free_on = if to == 3 { vec![to] } else { vec![from, to] };
        for step in free_on {
            assert!(
                steps.get(step).await?.inspect(&k).await?.is_none(),
                "step {step} still sees a holder after the release"
            );
        }
        // Released on both shards: the next grant, on either step, is
        // higher.
        let after = grant(&**steps.get(to).await?, key, "next").await?;
        assert!(after > token);
        steps
            .get(to)
            .await?
            .release(&fencelock_core::LeaseId::new(k, Owner::new("next")?, after))
            .await?;
    }
    Ok(())
}

/// A lease of the old map (one shard), renewed on `join` and then on
/// `handover`: the `join` renewal takes the new shard's half (floored at
/// the lease's token), so that a `handover` acquirer, which takes the new
/// shard first, is refused, and the `handover` renewal finds both halves.
#[tokio::test]
async fn a_lease_of_the_old_map_lives_through_join_and_handover() -> TestResult {
    let key = moving_keys("span", 1).await?.remove(0);
    let k = LockKey::new(key.as_str())?;
    let steps = Steps::new(steps(["mem://span-a", "mem://span-b"])?);
    let token = grant(&**steps.get(0).await?, &key, "holder").await?;
    let lease = fencelock_core::LeaseId::new(k.clone(), Owner::new("holder")?, token);
    assert_eq!(steps.get(1).await?.renew(&lease, TTL).await?.token, token);
    for step in [1, 2] {
        let rival = steps
            .get(step)
            .await?
            .try_acquire(&request(&key, "rival")?)
            .await?;
        assert!(matches!(rival, Acquire::Held(_)), "step {step}: {rival:?}");
        let info = steps.get(step).await?.inspect(&k).await?.ok_or("free")?;
        assert_eq!((info.owner.as_str(), info.token), ("holder", token));
    }
    assert_eq!(steps.get(2).await?.renew(&lease, TTL).await?.token, token);
    steps.get(2).await?.release(&lease).await?;
    assert!(grant(&**steps.get(2).await?, &key, "next").await? > token);
    Ok(())
}

/// A process more than one step from what the shards have seen is refused
/// with a typed error: on open, and on its next operation if it was
/// already running when the newer step used the shards. Jumping from the
/// old map to the new one (which would let two holders have a moving key
/// at once) is refused the same way.
#[tokio::test]
async fn steps_two_apart_are_refused() -> TestResult {
    let key = moving_keys("apart", 1).await?.remove(0);
    let maps = steps(["mem://apart-a", "mem://apart-b"])?;
    let old = ShardedBackend::open(maps[0].clone(), common::open).await?;
    let token = grant(&old, &key, "old").await?;
    // The jump: refused, because the shards have only seen step 1.
    match ShardedBackend::open(maps[3].clone(), common::open).await {
        Err(e) if is_epoch_refusal(&e) => {
            assert!(e.to_string().contains("epoch 4 is too new"), "{e}");
        }
        other => return Err(format!("the jump was not refused: {other:?}").into()),
    }
    let lease =
        fencelock_core::LeaseId::new(LockKey::new(key.as_str())?, Owner::new("old")?, token);
    old.release(&lease).await?;
    // The rolling deployment goes on: join, then handover.
    let join = ShardedBackend::open(maps[1].clone(), common::open).await?;
    grant(&join, &key, "join").await?;
    let handover = ShardedBackend::open(maps[2].clone(), common::open).await?;
    // The old process, still running, is refused from now on...
    for result in [
        old.try_acquire(&request(&key, "old")?).await.map(|_| ()),
        old.inspect(&LockKey::new(key.as_str())?).await.map(|_| ()),
        old.list(None).await.map(|_| ()),
    ] {
        match result {
            Err(e) if is_epoch_refusal(&e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("epoch 1 is too old") && msg.contains("has seen epoch 3"),
                    "{msg}"
                );
            }
            other => return Err(format!("step 1 was not refused: {other:?}").into()),
        }
    }
    // ...and so is a new process of the old map.
    assert!(matches!(
        ShardedBackend::open(maps[0].clone(), common::open).await,
        Err(e) if is_epoch_refusal(&e)
    ));
    // The adjacent steps still work together.
    assert!(matches!(
        handover.try_acquire(&request(&key, "handover")?).await?,
        Acquire::Held(_)
    ));
    Ok(())
}

/// Many processes of three consecutive steps open at once on fresh shards:
/// whatever order their raises land in, the record never goes down, so
/// once a process of the third step has been admitted, the first step is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_opens_never_lower_the_recorded_epoch() -> TestResult {
    for round in 0..20 {
        let maps = steps([
            &format!("mem://race{round}-a"),
            &format!("mem://race{round}-b"),
        ])?;
        let mut tasks = Vec::new();
        for i in 0..24 {
            let map = maps[i % 3].clone();
            tasks.push(tokio::spawn(async move {
                (
                    i % 3,
                    ShardedBackend::open(map, common::open).await.map(|_| ()),
                )
            }));
        }
        let mut newest_admitted = 0;
        for task in tasks {
            match task.await? {
                (step, Ok(())) => newest_admitted = newest_admitted.max(step),
                (_, Err(e)) if is_epoch_refusal(&e) => {}
                (_, Err(e)) => return Err(e.into()),
            }
        }
        let late = ShardedBackend::open(maps[0].clone(), common::open).await;
        if newest_admitted == 2 {
            assert!(
                matches!(&late, Err(e) if is_epoch_refusal(e)),
                "round {round}: step 1 admitted after step 3: {late:?}"
            );
        }
    }
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
    let steps = Arc::new(Steps::new(steps(["mem://run-a", "mem://run-b"])?));
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
                    let granted = steps
                        .get(step)
                        .await?
                        .try_acquire(&request(&key, &owner)?)
                        .await;
                    let g = match granted {
                        Ok(Acquire::Granted(g)) => g,
                        // Refused, or the step was retired (two behind the
                        // newest) between choosing it and asking.
                        Ok(Acquire::Held(_)) => {
                            tokio::task::yield_now().await;
                            continue;
                        }
                        Err(e) if is_epoch_refusal(&e) => continue,
                        Err(e) => return Err(e.into()),
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
                    // Released by the next step once it is out, as a
                    // holder that reopened on it would.
                    let newest = (grants.load(Ordering::SeqCst) / GRANTS_PER_STEP).min(3);
                    let by = newest.clamp(step, step + 1);
                    steps.get(by).await?.release(&lease).await?;
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

/// The epoch record lives in reserved keys of each shard: `list` and
/// `stats` never show it, and a caller cannot take, read or remove it.
#[tokio::test]
async fn the_epoch_record_is_hidden_and_reserved() -> TestResult {
    let steps = Steps::new(steps(["mem://hidden-a", "mem://hidden-b"])?);
    let join = steps.get(1).await?;
    assert!(join.administer()?.list(None).await?.is_empty());
    assert_eq!(join.administer()?.stats().await?.held, 0);
    let reserved = LockKey::new("fencelock-sharded:epoch:0")?;
    assert!(matches!(
        join.try_acquire(&request(reserved.as_str(), "me")?).await,
        Err(fencelock_core::Error::InvalidKey(_))
    ));
    assert!(matches!(
        join.administer()?.force_release(&reserved).await,
        Err(fencelock_core::Error::InvalidKey(_))
    ));
    // It is there, on each shard, for any process that opens the store
    // directly.
    for url in ["mem://hidden-a", "mem://hidden-b"] {
        let info = common::open(url.into())
            .await?
            .inspect(&reserved)
            .await?
            .ok_or("no record")?;
        assert_eq!(info.owner.as_str(), "fencelock-sharded:epoch:2");
    }
    Ok(())
}

/// A key taken many times on the old map and left alone during `join` is
/// next granted by its new owner, which never saw those tokens: `handover`
/// and the new map must still grant above them (I2). Shard `a` issues far
/// more tokens than `b` here, as an old shard does.
#[tokio::test]
async fn a_key_left_alone_during_join_keeps_its_token_order() -> TestResult {
    let keys = moving_keys("idle", 2).await?;
    let steps = Steps::new(steps(["mem://idle-a", "mem://idle-b"])?);
    let mut old = Vec::new();
    for key in &keys {
        let mut token = FencingToken(0);
        for i in 0..20 {
            let owner = format!("o{i}");
            token = grant(&**steps.get(0).await?, key, &owner).await?;
            let lease = fencelock_core::LeaseId::new(
                LockKey::new(key.as_str())?,
                Owner::new(owner)?,
                token,
            );
            steps.get(0).await?.release(&lease).await?;
        }
        old.push(token);
    }
    steps.get(1).await?;
    let handover = grant(&**steps.get(2).await?, &keys[0], "h").await?;
    assert!(
        handover > old[0],
        "handover gave {handover} after the old map's {}",
        old[0]
    );
    let new = grant(&**steps.get(3).await?, &keys[1], "n").await?;
    assert!(
        new > old[1],
        "the new map gave {new} after the old map's {}",
        old[1]
    );
    Ok(())
}
