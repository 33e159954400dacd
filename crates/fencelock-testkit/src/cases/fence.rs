//! I7: a fence admits t iff t ≥ the highest admitted, then remembers the max.

use std::sync::Arc;

use fencelock_core::{Error, Fence, FencedValue, FencingToken, LockMode};
use tokio::sync::Mutex;

use super::{ensure, fence_of, grant, key, long_ttl, owner, short_ttl, wait_out};
use crate::suite::{Store, TestResult};

/// Equal and higher tokens pass; lower ones are `Stale` with both tokens;
/// resources are independent; bad resource names are typed errors.
pub async fn i7_fence_rule(store: &dyn Store) -> TestResult {
    let fence = fence_of(store).await?;
    ensure!(
        fence.highest("orders").await?.is_none(),
        "a fresh resource has a token"
    );
    fence.admit("orders", FencingToken(5)).await?;
    fence.admit("orders", FencingToken(5)).await?; // the same holder writes twice
    fence.admit("orders", FencingToken(7)).await?;
    match fence.admit("orders", FencingToken(6)).await {
        Err(Error::Stale {
            resource,
            presented,
            current,
        }) => ensure!(
            resource == "orders" && presented == FencingToken(6) && current == FencingToken(7),
            "Stale reported {resource} {presented} {current}"
        ),
        other => return Err(format!("token 6 after 7 gave {other:?}").into()),
    }
    ensure!(
        fence.highest("orders").await? == Some(FencingToken(7)),
        "highest changed after a refusal"
    );
    fence.admit("invoices", FencingToken(1)).await?;
    ensure!(
        fence.highest("orders").await? == Some(FencingToken(7)),
        "resources are not independent"
    );
    fence.admit("big", FencingToken(u64::MAX)).await?;
    ensure!(
        fence.highest("big").await? == Some(FencingToken(u64::MAX)),
        "u64::MAX did not round-trip"
    );
    for bad in ["", "a\0b"] {
        let r = fence.admit(bad, FencingToken(1)).await;
        ensure!(
            matches!(r, Err(Error::InvalidKey(_))),
            "resource {bad:?} gave {r:?}"
        );
    }
    Ok(())
}

/// The lost-update scenario of `docs/semantics.md` (I7, admit before you read), played out with real grants: A
/// holds, pauses past its lease; B takes over, admits its token, reads; A
/// wakes and tries to write; B writes. Because B admitted before reading,
/// A's write is refused and B's update is not lost.
pub async fn i7_admit_before_read_prevents_lost_update(store: &dyn Store) -> TestResult {
    let backend = store.connect().await?;
    let fence = fence_of(store).await?;
    let k = key("counter-lock");
    let counter = Arc::new(Mutex::new(0u64));
    let write = |fence: Arc<dyn Fence>,
                 counter: Arc<Mutex<u64>>,
                 token: FencingToken,
                 value: u64| async move {
        fence.admit("counter", token).await?;
        *counter.lock().await = value;
        Ok::<(), Error>(())
    };
    // A: acquire, admit, read 0 ... then pause past its lease.
    let a = grant(&*backend, &k, &owner("a"), short_ttl()).await?;
    fence.admit("counter", a.token).await?;
    let a_read = *counter.lock().await;
    wait_out(&*backend, &k, &a).await?;
    // B: acquire, admit *before* reading, read.
    let b = grant(&*backend, &k, &owner("b"), long_ttl()).await?;
    fence.admit("counter", b.token).await?;
    let b_read = *counter.lock().await;
    // A wakes up and writes its stale increment: refused.
    let a_write = write(
        Arc::clone(&fence),
        Arc::clone(&counter),
        a.token,
        a_read + 1,
    )
    .await;
    ensure!(
        matches!(a_write, Err(Error::Stale { .. })),
        "the stale holder's write was admitted: {a_write:?}"
    );
    // B writes its increment: admitted, and nothing was lost.
    write(
        Arc::clone(&fence),
        Arc::clone(&counter),
        b.token,
        b_read + 1,
    )
    .await?;
    ensure!(
        *counter.lock().await == 1,
        "counter is {}",
        *counter.lock().await
    );
    Ok(())
}

/// Concurrent admits from many tasks, in scrambled order, leave the maximum
/// as the highest, and every refusal reports a current token above the one
/// refused. (The order in which the fence saw the admits cannot be observed
/// from outside, so "admitted ≥ highest so far" is checked sequentially by
/// `i7_fence_rule`.)
pub async fn i7_concurrent_admits_keep_the_maximum(store: &dyn Store) -> TestResult {
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let fence = fence_of(store).await?;
        // A scrambled order, so higher tokens do not simply arrive last.
        let token = FencingToken((i * 7919) % 32 + 1);
        tasks.push(tokio::spawn(async move {
            match fence.admit("shared", token).await {
                Ok(()) => Ok(Some(token)),
                Err(Error::Stale { current, .. }) if current > token => Ok(None),
                Err(e) => Err(e),
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await??.is_some());
    }
    let fence = fence_of(store).await?;
    ensure!(
        fence.highest("shared").await? == Some(FencingToken(32)),
        "highest is {:?}",
        fence.highest("shared").await?
    );
    ensure!(admitted >= 1, "nothing was admitted");
    Ok(())
}

/// The operator's repair ([`Fence::reset`]): it answers the highest token
/// admitted in either mode and forgets the highest token, the highest
/// writer token and the stored value, so that tokens below every one it
/// forgot are admitted again; other resources keep theirs; a resource
/// never fenced answers `None`. Every fence the library ships resets.
pub async fn reset_forgets_the_tokens_and_the_value(store: &dyn Store) -> TestResult {
    let fence = fence_of(store).await?;
    let had = fence.reset("never-fenced").await?;
    ensure!(had.is_none(), "a resource never fenced had {had:?}");
    ensure!(
        fence.highest("never-fenced").await?.is_none(),
        "resetting nothing left a token"
    );
    fence.admit("kept", FencingToken(8)).await?;
    fence.admit("blocked", FencingToken(5)).await?;
    let mut highest = 5;
    if fence.values() {
        fence
            .write_value("blocked", FencingToken(7), br#"{"v":7}"#)
            .await?;
        highest = 7;
    }
    if fence.shared() {
        // A reader above the writer: the highest of all is a reader's.
        fence
            .admit_shared("blocked", FencingToken(9), LockMode::Shared)
            .await?;
        highest = 9;
    }
    let had = fence.reset("blocked").await?;
    ensure!(
        had == Some(FencingToken(highest)),
        "the reset answered {had:?}, not {highest}"
    );
    ensure!(
        fence.highest("blocked").await?.is_none(),
        "the highest token outlived the reset: {:?}",
        fence.highest("blocked").await?
    );
    if fence.shared() {
        let writer = fence.highest_writer("blocked").await?;
        ensure!(
            writer.is_none(),
            "the writer token outlived the reset: {writer:?}"
        );
        // Below the forgotten writer token, which refused it before.
        fence
            .admit_shared("blocked", FencingToken(3), LockMode::Shared)
            .await?;
    }
    if fence.values() {
        let read = fence.read_value("blocked").await?;
        ensure!(read.is_none(), "the value outlived the reset: {read:?}");
    }
    // Below every token forgotten.
    fence.admit("blocked", FencingToken(4)).await?;
    ensure!(
        fence.highest("blocked").await? == Some(FencingToken(4)),
        "after the reset the highest is {:?}",
        fence.highest("blocked").await?
    );
    ensure!(
        fence.highest("kept").await? == Some(FencingToken(8)),
        "resetting one resource changed another: {:?}",
        fence.highest("kept").await?
    );
    let again = fence.reset("blocked").await?;
    ensure!(
        again == Some(FencingToken(4)),
        "a second reset answered {again:?}"
    );
    Ok(())
}

/// Resets racing with writers of values, each on its own connection: a
/// reset is one atomic step, so whatever the interleaving the fence and the
/// value agree whenever the racers pause, as they do after writes alone:
/// both absent, or the value is the one written with the highest token. (A
/// reset that deleted the token and the value in two steps could leave a
/// token whose value it erased, or a value without its token; the race is
/// run many times, each time with higher tokens, to give that a chance.)
pub async fn resets_racing_writers_leave_token_and_value_agreeing(store: &dyn Store) -> TestResult {
    let reader = fence_of(store).await?;
    if !reader.values() {
        return Ok(());
    }
    // One connection per racer, kept for every race.
    let mut racers = Vec::new();
    for _ in 0..12 {
        racers.push(fence_of(store).await?);
    }
    for race in 0..24u64 {
        let mut tasks = Vec::new();
        for (i, fence) in (0u64..).zip(&racers) {
            let fence = Arc::clone(fence);
            tasks.push(tokio::spawn(async move {
                if i % 3 == 2 {
                    return fence.reset("raced").await.map(drop);
                }
                // Distinct tokens above the last race's, in a scrambled
                // order, so that higher tokens do not simply arrive last.
                let token = FencingToken(race * 12 + (i * 7919) % 12 + 1);
                let value = format!(r#"{{"writer":{}}}"#, token.get());
                match fence.write_value("raced", token, value.as_bytes()).await {
                    Ok(()) | Err(Error::Stale { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }));
        }
        for task in tasks {
            task.await??;
        }
        let highest = reader.highest("raced").await?;
        let read = reader.read_value("raced").await?;
        let expected = highest
            .map(|t| FencedValue::new(t, format!(r#"{{"writer":{}}}"#, t.get()).into_bytes()));
        ensure!(
            read == expected,
            "race {race}: the highest token is {highest:?} but the value {read:?}"
        );
    }
    Ok(())
}
