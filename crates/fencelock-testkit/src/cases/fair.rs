//! FIFO waiting (`docs/fairness.md`), on backends that claim `fair`:
//! waiters are granted in the order they started waiting, with tokens
//! increasing in that order; a single try leaves no queue entry and never
//! overtakes a waiter; a wait that ends without a grant (deadline passed,
//! future dropped) withdraws its entry at once; a crashed waiter's entry
//! blocks the queue at most until its own reported expiry.
//!
//! Order is made deterministic without sleeps: each waiter starts only once
//! the previous one's entry is listed by `FairQueue::queue`. Bounds are the
//! entries' expiries as the backend reports them, plus [`expiry_slack`].
//!
//! Backends that do not claim `fair` must offer no queue
//! (`Backend::fair_queue` is `None`); the rest of each case is then
//! skipped.

use std::time::Duration;

use fencelock_core::{
    Acquire, Backend, Error, FairQueue, LockClient, LockGuard, LockInfo, LockKey,
};
use tokio::{sync::mpsc, task::JoinHandle, time::Instant};

use super::{client, ensure, expiry_slack, key, long_ttl, owner, request, short_ttl};
use crate::suite::{Store, TestResult};

/// Longer than any of these cases: a waiter that is not granted fails the
/// case through its assertions, not through its wait running out.
fn long_wait() -> Duration {
    super::patient(Duration::from_secs(120))
}

/// `Ok(true)` when the store claims `fair`, after checking that the claim
/// and the queue on offer agree.
async fn fair_or_skip(store: &dyn Store) -> TestResult<bool> {
    let b = store.connect().await?;
    let offered = b.fair_queue().is_some();
    ensure!(
        offered == b.capabilities().fair,
        "fair claimed {} but a queue offered {offered}",
        b.capabilities().fair
    );
    Ok(offered)
}

/// `b`'s queue (the store claims `fair`).
fn queue_of(b: &dyn Backend) -> TestResult<&dyn FairQueue> {
    b.fair_queue()
        .ok_or_else(|| "fair claimed without a queue".into())
}

/// Polls `b.queue(k)` until it lists exactly `owners`, in that order.
async fn entries_become(
    b: &dyn Backend,
    k: &LockKey,
    owners: &[&str],
) -> TestResult<Vec<LockInfo>> {
    let bound = Instant::now() + expiry_slack();
    loop {
        let listed = queue_of(b)?.queue(k).await?;
        if listed
            .iter()
            .map(|e| e.owner.as_str())
            .eq(owners.iter().copied())
        {
            return Ok(listed);
        }
        ensure!(
            Instant::now() < bound,
            "the queue of {k} never became {owners:?}: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A waiter on its own connection, waiting up to `wait`.
async fn waiter(
    store: &dyn Store,
    name: &str,
    k: &LockKey,
    wait: Duration,
) -> TestResult<JoinHandle<fencelock_core::Result<LockGuard>>> {
    let c: LockClient = client(store, name).await?;
    let k = k.as_str().to_owned();
    Ok(tokio::spawn(async move {
        c.lock(k).ttl(long_ttl()).wait(wait).acquire().await
    }))
}

/// Waiters started one after another are granted in that order, each with
/// a token above its predecessor's, and leave an empty queue.
pub async fn waiters_are_granted_in_arrival_order(store: &dyn Store) -> TestResult {
    let k = key("fair-order");
    if !fair_or_skip(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let holder = client(store, "holder").await?;
    let held = holder.lock(k.as_str()).ttl(long_ttl()).acquire().await?;
    let names = ["waiter-0", "waiter-1", "waiter-2", "waiter-3"];
    let (granted, mut grants) = mpsc::unbounded_channel();
    let mut waiting = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let c = client(store, name).await?;
        let (key, granted) = (k.as_str().to_owned(), granted.clone());
        waiting.push(tokio::spawn(async move {
            let guard = c
                .lock(key)
                .ttl(long_ttl())
                .wait(long_wait())
                .acquire()
                .await?;
            // Reported before the release, so the channel's order is the
            // order of grants.
            let _ = granted.send((guard.owner().clone(), guard.token()));
            guard.release().await
        }));
        entries_become(&*b, &k, &names[..=i]).await?;
    }
    let mut last = held.token();
    held.release().await?;
    for name in names {
        let (who, token) = grants
            .recv()
            .await
            .ok_or("a waiter ended without a grant")?;
        ensure!(
            who.as_str() == name,
            "{who} was granted while {name} waited longer"
        );
        ensure!(
            token > last,
            "{who}'s token {token} <= {last}, granted before"
        );
        last = token;
    }
    for w in waiting {
        w.await??;
    }
    let left = queue_of(&*b)?.queue(&k).await?;
    ensure!(left.is_empty(), "granted waiters left entries: {left:?}");
    Ok(())
}

/// A single try neither leaves an entry nor takes the key from a waiter,
/// even when it comes right after the holder's release.
pub async fn a_single_try_leaves_nothing_and_never_overtakes(store: &dyn Store) -> TestResult {
    let k = key("fair-try");
    if !fair_or_skip(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let holder = client(store, "holder").await?;
    let held = holder.lock(k.as_str()).ttl(long_ttl()).acquire().await?;
    let tried = client(store, "trier").await?.try_lock(k.as_str()).await?;
    ensure!(tried.is_none(), "a held key was granted to a single try");
    let listed = queue_of(&*b)?.queue(&k).await?;
    ensure!(listed.is_empty(), "a single try left an entry: {listed:?}");
    let w = waiter(store, "waiter", &k, long_wait()).await?;
    entries_become(&*b, &k, &["waiter"]).await?;
    held.release().await?;
    // Whether or not the waiter has taken the key yet, a one-shot try must
    // be refused: the key is held, or it is the waiter's turn.
    let t = b
        .try_acquire(&request(&k, &owner("trier"), long_ttl()))
        .await?;
    ensure!(
        matches!(t, Acquire::Held(_)),
        "a single try overtook a waiter: {t:?}"
    );
    let guard = w.await??;
    ensure!(guard.owner().as_str() == "waiter", "{}", guard.owner());
    guard.release().await?;
    entries_become(&*b, &k, &[]).await?;
    Ok(())
}

/// A wait whose deadline passes has left the queue when it returns; a
/// dropped wait leaves it in the background, long before its entry would
/// expire; neither delays the waiter behind them.
pub async fn abandoned_waits_do_not_delay_the_next(store: &dyn Store) -> TestResult {
    let k = key("fair-abandon");
    if !fair_or_skip(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let holder = client(store, "holder").await?;
    let held = holder.lock(k.as_str()).ttl(long_ttl()).acquire().await?;
    // Long enough to be listed before its deadline on any engine.
    let timing_out = waiter(
        store,
        "times-out",
        &k,
        super::patient(Duration::from_secs(3)),
    )
    .await?;
    entries_become(&*b, &k, &["times-out"]).await?;
    let dropped = waiter(store, "dropped", &k, long_wait()).await?;
    let listed = entries_become(&*b, &k, &["times-out", "dropped"]).await?;
    let dropped_listed = Instant::now();
    let dropped_expiry = listed
        .get(1)
        .map(|e| e.expires_in)
        .ok_or("the dropped waiter's entry vanished")?;
    let next = waiter(store, "next", &k, long_wait()).await?;
    entries_become(&*b, &k, &["times-out", "dropped", "next"]).await?;
    dropped.abort();
    ensure!(
        dropped.await.is_err_and(|e| e.is_cancelled()),
        "the dropped wait was not cancelled"
    );
    // Timed from the listing to the first look that no longer finds the
    // entry, not to the end of the case: the short wait's deadline, which
    // the budget lengthens, may well come after the entry's expiry.
    let bound = dropped_listed + dropped_expiry + expiry_slack();
    while queue_of(&*b)?
        .queue(&k)
        .await?
        .iter()
        .any(|e| e.owner.as_str() == "dropped")
    {
        ensure!(
            Instant::now() < bound,
            "the dropped wait's entry outlived its expiry ({dropped_expiry:?})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ensure!(
        dropped_listed.elapsed() < dropped_expiry,
        "the dropped wait's entry lasted until its expiry ({dropped_expiry:?})"
    );
    let timed_out = timing_out.await?;
    ensure!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "the short wait: {timed_out:?}"
    );
    // Withdrawn before the timeout was returned.
    let listed = queue_of(&*b)?.queue(&k).await?;
    ensure!(
        listed.iter().all(|e| e.owner.as_str() != "times-out"),
        "a wait that timed out left its entry: {listed:?}"
    );
    entries_become(&*b, &k, &["next"]).await?;
    held.release().await?;
    let guard = next.await??;
    ensure!(guard.owner().as_str() == "next", "{}", guard.owner());
    guard.release().await?;
    Ok(())
}

/// An entry left by a waiter that made one queued attempt and vanished
/// holds the key back from the next waiter until the entry expires (by the
/// backend's own reckoning), and no longer than that plus the usual slack.
/// Where entries are bound to the waiter's session, the entry goes as soon
/// as its backend is dropped, and holds back nobody.
pub async fn a_crashed_waiters_entry_blocks_at_most_its_ttl(store: &dyn Store) -> TestResult {
    let k = key("fair-crash");
    if !fair_or_skip(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let holder = client(store, "holder").await?;
    let held = holder.lock(k.as_str()).ttl(long_ttl()).acquire().await?;
    let crashed = store.connect().await?;
    let queued = request(&k, &owner("crashed"), short_ttl()).with_queue(true);
    let first = crashed.try_acquire(&queued).await?;
    ensure!(
        matches!(first, Acquire::Held(_)),
        "a held key was granted: {first:?}"
    );
    let session_bound = crashed.capabilities().session_bound;
    drop(crashed);
    let bound = match session_bound {
        true => {
            entries_become(&*b, &k, &[]).await?;
            Instant::now() + expiry_slack()
        }
        false => {
            let listed = entries_become(&*b, &k, &["crashed"]).await?;
            let seen = Instant::now();
            let expiry = listed
                .first()
                .map(|e| e.expires_in)
                .ok_or("the crashed entry vanished")?;
            seen + expiry + expiry_slack()
        }
    };
    let next = waiter(store, "next", &k, long_wait()).await?;
    // Either order is fine here: the crashed entry may expire meanwhile.
    loop {
        let listed = queue_of(&*b)?.queue(&k).await?;
        if listed.iter().any(|e| e.owner.as_str() == "next") {
            break;
        }
        ensure!(Instant::now() < bound, "the next waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t1 = held.token();
    held.release().await?;
    // While the crashed entry is still listed, the key is not the next
    // waiter's: an entry listed after a grant existed at that grant.
    let holder_now = b.inspect(&k).await?;
    let still = queue_of(&*b)?.queue(&k).await?;
    if still.iter().any(|e| e.owner.as_str() == "crashed") {
        ensure!(
            holder_now
                .as_ref()
                .is_none_or(|h| h.owner.as_str() != "next"),
            "granted past a live entry ahead: {holder_now:?}, queue {still:?}"
        );
    }
    let guard = tokio::time::timeout_at(bound, next)
        .await
        .map_err(|_| "the next waiter was not granted by the end of the crashed entry's expiry plus the usual slack")???;
    ensure!(guard.token() > t1, "token {} <= {t1}", guard.token());
    let gone = queue_of(&*b)?.queue(&k).await?;
    ensure!(gone.is_empty(), "entries left: {gone:?}");
    guard.release().await?;
    Ok(())
}
