//! Multi-key locks (`docs/multi-key.md`): all or nothing, no deadlock
//! whatever the order of the keys, loss of any part signalled.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{Error, LossReason};

use super::{client, ensure, guard_ttl, key, long_ttl};
use crate::suite::{Store, TestResult};

/// Two clients take overlapping key sets, listed in opposite orders, 20
/// times each at once: both finish (no deadlock: each wait would end in
/// `Timeout`, failing the case) and never hold a common key together.
pub async fn opposite_orders_never_deadlock(store: &dyn Store) -> TestResult {
    let sets = vec![
        vec!["multi-a", "multi-b", "multi-c"],
        vec!["multi-d", "multi-c", "multi-b"],
    ];
    race_key_sets(store, "multi", sets, 20).await
}

/// One client per set of `sets` takes its set `rounds` times, all at once
/// with a minute's wait: every call finishes (a deadlock would end in
/// `Timeout`) and no key is ever held by two of them together.
pub(super) async fn race_key_sets(
    store: &dyn Store,
    name: &str,
    sets: Vec<Vec<&'static str>>,
    rounds: usize,
) -> TestResult {
    let held: Arc<HashMap<&'static str, AtomicBool>> = Arc::new(
        sets.iter()
            .flatten()
            .map(|k| (*k, AtomicBool::new(false)))
            .collect(),
    );
    let mut tasks = Vec::new();
    for (i, keys) in sets.into_iter().enumerate() {
        let client = client(store, &format!("{name}-{i}")).await?;
        let held = Arc::clone(&held);
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let all = client
                    .lock_all(keys.iter().copied())
                    .ttl(long_ttl())
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .map_err(|e| e.to_string())?;
                for k in &keys {
                    if held[k].swap(true, Ordering::SeqCst) {
                        return Err(format!("{k} was granted to two clients at once"));
                    }
                }
                tokio::task::yield_now().await;
                for k in &keys {
                    held[k].store(false, Ordering::SeqCst);
                }
                all.release().await.map_err(|e| e.to_string())?;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// When one key is held elsewhere, the call ends in `Timeout` naming that
/// key, and none of the other keys stays held; an invalid key or an empty
/// list takes nothing; duplicates count once.
pub async fn partial_failure_leaves_nothing_held(store: &dyn Store) -> TestResult {
    let other = client(store, "multi-other").await?;
    let c = client(store, "multi-taker").await?;
    let _blocker = other.lock("part-b").ttl(long_ttl()).acquire().await?;
    let result = c
        .lock_all(["part-c", "part-b", "part-a"])
        .ttl(long_ttl())
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    match result {
        Err(Error::Timeout { key, waited }) => ensure!(
            key.as_str() == "part-b" && waited == Duration::from_millis(300),
            "timeout on {key} after {waited:?}"
        ),
        other => return Err(format!("expected Timeout, got {other:?}").into()),
    }
    ensure!(
        c.inspect("part-a").await?.is_none() && c.inspect("part-c").await?.is_none(),
        "a failed lock_all left a part held"
    );
    ensure!(
        c.lock_all(["part-a", "part-b"])
            .try_acquire()
            .await?
            .is_none(),
        "try_acquire with a held key returned a guard"
    );
    ensure!(
        c.inspect("part-a").await?.is_none(),
        "a failed try_acquire left a part held"
    );
    let bad = c.lock_all(["part-a", "bad\0key"]).acquire().await;
    ensure!(
        matches!(bad, Err(Error::InvalidKey(_))),
        "bad key gave {bad:?}"
    );
    ensure!(
        c.inspect("part-a").await?.is_none(),
        "an invalid list took a key"
    );
    let empty = c.lock_all(Vec::<String>::new()).acquire().await;
    ensure!(
        matches!(empty, Err(Error::InvalidArgument(_))),
        "an empty list gave {empty:?}"
    );
    let dup = c.lock_all(["part-d", "part-d"]).acquire().await?;
    ensure!(
        dup.keys() == vec![key("part-d")],
        "duplicates: {:?}",
        dup.keys()
    );
    dup.release().await?;
    Ok(())
}

/// Force-releasing one part makes the multi guard lost: `lost()` names
/// that part, `check()` fails, and releasing frees the rest.
pub async fn loss_of_one_part_is_signalled(store: &dyn Store) -> TestResult {
    let c = client(store, "multi-victim").await?;
    let admin = store.connect().await?;
    let all = c
        .lock_all(["loss-a", "loss-b"])
        .ttl(guard_ttl())
        .acquire()
        .await?;
    all.check()?;
    admin
        .administer()?
        .force_release(&key("loss-b"))
        .await?
        .ok_or("nothing to force-release")?;
    let bound = all.guards()[1].granted_ttl() * 10 + super::patient(Duration::from_secs(5));
    let (lost_key, reason) = tokio::time::timeout(bound, all.lost())
        .await
        .map_err(|_| "loss of a part not noticed")?;
    ensure!(
        lost_key.as_str() == "loss-b" && reason == LossReason::Refused,
        "lost {lost_key} for {reason:?}"
    );
    ensure!(
        matches!(all.check(), Err(Error::LockLost { .. })) && !all.is_valid(),
        "the multi guard passes its check after losing a part"
    );
    let released = all.release().await;
    ensure!(
        matches!(released, Err(Error::NotHeld { .. })),
        "release after a lost part: {released:?}"
    );
    ensure!(
        c.inspect("loss-a").await?.is_none(),
        "the part still held was not released"
    );
    Ok(())
}

/// Each key's token is the one the backend's `inspect` shows, sorted by key.
pub async fn tokens_per_key_match_inspect(store: &dyn Store) -> TestResult {
    let c = client(store, "multi-tokens").await?;
    let all = c
        .lock_all(["tok-3", "tok-1", "tok-2"])
        .ttl(long_ttl())
        .acquire()
        .await?;
    let tokens = all.tokens();
    let keys: Vec<&str> = tokens.iter().map(|(k, _)| k.as_str()).collect();
    ensure!(keys == ["tok-1", "tok-2", "tok-3"], "keys {keys:?}");
    for (k, token) in &tokens {
        let lease = c
            .inspect(k.as_str())
            .await?
            .ok_or("a part is not on the backend")?;
        ensure!(
            lease.token == *token && lease.owner.as_str() == "multi-tokens",
            "{k}: guard token {token}, backend {lease:?}"
        );
        ensure!(all.token(k.as_str()) == Some(*token), "token({k})");
    }
    ensure!(all.token("tok-9").is_none(), "token of a key not held");
    all.release().await?;
    for k in ["tok-1", "tok-2", "tok-3"] {
        ensure!(
            c.inspect(k).await?.is_none(),
            "{k} still held after release"
        );
    }
    Ok(())
}
