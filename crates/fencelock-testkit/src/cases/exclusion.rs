//! I1: at most one unexpired lease per key; N racers, exactly one winner.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, Backend, FencingToken, LockKey};

use super::{connections, ensure, grant, key, long_ttl, owner, request, short_ttl, wait_out};
use crate::suite::{Store, TestResult};

const RACERS: usize = 64;
const CONNECTIONS: usize = 8;
/// Rounds of each race case: all of them where a round takes milliseconds,
/// at least [`MIN_REPETITIONS`] where rounds are slow. Each try of
/// ZooKeeper's Curator layout is two writes through the leader (its
/// sequential node, then that node's deletion): its three exclusion cases
/// took 100 s together on an idle 2-core machine, and the two races ran
/// past the suite's 180 s bound beside a CI run. A round's strength is its
/// 64 racers, so a slow store runs fewer rounds rather than fail the bound.
const REPETITIONS: usize = 200;
const MIN_REPETITIONS: usize = 50;
/// After this long a case runs no round beyond [`MIN_REPETITIONS`].
const RACE_BUDGET: Duration = Duration::from_secs(60);

/// Whether round `rep` (from 0) of a case begun at `started` runs.
fn another_round(rep: usize, started: Instant) -> bool {
    rep < MIN_REPETITIONS || (rep < REPETITIONS && started.elapsed() < RACE_BUDGET)
}

/// Races `RACERS` acquirers (spread over `conns`) on `key`; returns the
/// winners' (owner index, token).
async fn race(conns: &[Arc<dyn Backend>], key: &LockKey) -> TestResult<Vec<(usize, FencingToken)>> {
    let mut tasks = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let backend = Arc::clone(&conns[i % conns.len()]);
        let req = request(key, &owner(&format!("racer-{i}")), long_ttl());
        tasks.push(tokio::spawn(async move { backend.try_acquire(&req).await }));
    }
    let mut winners = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        if let Acquire::Granted(g) = task.await?? {
            winners.push((i, g.token));
        }
    }
    Ok(winners)
}

async fn check_single_winner(
    conns: &[Arc<dyn Backend>],
    key: &LockKey,
    winners: &[(usize, FencingToken)],
) -> TestResult {
    ensure!(
        winners.len() == 1,
        "{key}: {} racers won: {winners:?}",
        winners.len()
    );
    let (who, token) = winners[0];
    let lease = conns[0]
        .inspect(key)
        .await?
        .ok_or("the winner's lease is missing")?;
    ensure!(
        lease.owner.as_str() == format!("racer-{who}") && lease.token == token,
        "{key}: inspect shows {lease:?}, but racer-{who} won with token {token}"
    );
    Ok(())
}

/// 64 racers on a free key, 200 times (see [`REPETITIONS`]): exactly one
/// wins each time.
pub async fn i1_race_on_free_key(store: &dyn Store) -> TestResult {
    let started = Instant::now();
    let conns = connections(store, CONNECTIONS).await?;
    for rep in (0..).take_while(|&rep| another_round(rep, started)) {
        let k = key(&format!("i1-free-{rep}"));
        let winners = race(&conns, &k).await?;
        check_single_winner(&conns, &k, &winners).await?;
    }
    Ok(())
}

/// 64 racers on an expired key, 200 times (see [`REPETITIONS`]): exactly
/// one wins each time, with a token above the expired holder's.
pub async fn i1_race_on_expired_key(store: &dyn Store) -> TestResult {
    let started = Instant::now();
    let conns = connections(store, CONNECTIONS).await?;
    let keys: Vec<LockKey> = (0..REPETITIONS)
        .map(|rep| key(&format!("i1-expired-{rep}")))
        .collect();
    let old = owner("old-holder");
    let mut old_grants = Vec::with_capacity(keys.len());
    for k in &keys {
        old_grants.push(grant(&*conns[0], k, &old, short_ttl()).await?);
    }
    // Leases were granted in order, so the last one ends last.
    let last = keys.len() - 1;
    wait_out(&*conns[0], &keys[last], &old_grants[last]).await?;
    let rounds = (0..).take_while(|&rep| another_round(rep, started));
    for ((k, old_grant), _) in keys.iter().zip(&old_grants).zip(rounds) {
        ensure!(
            conns[0].inspect(k).await?.is_none(),
            "{k} should have expired"
        );
        let winners = race(&conns, k).await?;
        check_single_winner(&conns, k, &winners).await?;
        ensure!(
            winners[0].1 > old_grant.token,
            "{k}: takeover token {} is not above the expired {}",
            winners[0].1,
            old_grant.token
        );
    }
    Ok(())
}

/// While a lease is live, nobody else gets the key, and the answer names the
/// holder when the backend reports one.
pub async fn held_key_refuses_everyone(store: &dyn Store) -> TestResult {
    let conns = connections(store, CONNECTIONS).await?;
    let k = key("held");
    let holder = grant(&*conns[0], &k, &owner("holder"), long_ttl()).await?;
    let winners = race(&conns, &k).await?;
    ensure!(winners.is_empty(), "racers won a held key: {winners:?}");
    match conns[1]
        .try_acquire(&request(&k, &owner("late"), long_ttl()))
        .await?
    {
        Acquire::Held(Some(info)) => ensure!(
            info.token == holder.token && info.owner.as_str() == "holder",
            "Held names the wrong holder: {info:?}"
        ),
        Acquire::Held(None) => {}
        Acquire::Granted(g) => return Err(format!("a held key was granted again: {g:?}").into()),
    }
    // The same owner name does not get a second lease either: two tasks of
    // one process share an owner and must still exclude each other.
    let again = conns[1]
        .try_acquire(&request(&k, &owner("holder"), Duration::from_secs(5)))
        .await?;
    ensure!(
        matches!(again, Acquire::Held(_)),
        "the holder's owner name took the key twice: {again:?}"
    );
    Ok(())
}
