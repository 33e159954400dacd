//! The fenced key-value store of a fence ([`Fence::write_value`]): a value
//! is stored in the same atomic step as its writer's admission, in the
//! fence's own store. Values are compact JSON so that they round-trip
//! byte for byte through the lock service too.

use std::sync::Arc;

use fencelock_core::{Error, Fence, FencedValue, FencingToken, MAX_FENCED_VALUE};

use super::{ensure, fence_of};
use crate::suite::{Store, TestResult};

/// The store's fence when it claims values; otherwise checks that it
/// answers `Unsupported`, honestly, and returns `None`.
async fn values_fence(store: &dyn Store) -> TestResult<Option<Arc<dyn Fence>>> {
    let fence = fence_of(store).await?;
    if fence.values() {
        return Ok(Some(fence));
    }
    let write = fence.write_value("k", FencingToken(1), b"1").await;
    ensure!(
        matches!(write, Err(Error::Unsupported(_))),
        "a fence without values answered a write with {write:?}"
    );
    let read = fence.read_value("k").await;
    ensure!(
        matches!(read, Err(Error::Unsupported(_))),
        "a fence without values answered a read with {read:?}"
    );
    Ok(None)
}

fn stored(token: u64, value: &[u8]) -> Option<FencedValue> {
    Some(FencedValue::new(FencingToken(token), value.to_vec()))
}

/// A write stores the value with its token; the same token writes again;
/// a higher one replaces it; keys are independent; bad names are typed.
pub async fn write_then_read(store: &dyn Store) -> TestResult {
    let Some(fence) = values_fence(store).await? else {
        return Ok(());
    };
    ensure!(
        fence.read_value("config").await?.is_none(),
        "a fresh key has a value"
    );
    fence
        .write_value("config", FencingToken(5), br#"{"v":1}"#)
        .await?;
    let read = fence.read_value("config").await?;
    ensure!(read == stored(5, br#"{"v":1}"#), "read {read:?}");
    fence
        .write_value("config", FencingToken(5), br#"[1,"two",null]"#)
        .await?;
    fence
        .write_value("config", FencingToken(u64::MAX), br#""top""#)
        .await?;
    let read = fence.read_value("config").await?;
    ensure!(read == stored(u64::MAX, br#""top""#), "read {read:?}");
    ensure!(
        fence.highest("config").await? == Some(FencingToken(u64::MAX)),
        "the write did not admit its token: {:?}",
        fence.highest("config").await?
    );
    fence.write_value("other", FencingToken(1), b"2").await?;
    ensure!(
        fence.read_value("other").await? == stored(1, b"2")
            && fence.read_value("config").await? == stored(u64::MAX, br#""top""#),
        "keys are not independent"
    );
    for bad in ["", "a\0b"] {
        let r = fence.write_value(bad, FencingToken(1), b"1").await;
        ensure!(
            matches!(r, Err(Error::InvalidKey(_))),
            "key {bad:?} gave {r:?}"
        );
    }
    Ok(())
}

/// A write below the highest admitted token, whether that token came with
/// a value or from a plain admission, is `Stale` and changes nothing.
pub async fn stale_write_is_refused(store: &dyn Store) -> TestResult {
    let Some(fence) = values_fence(store).await? else {
        return Ok(());
    };
    fence.write_value("k", FencingToken(7), b"7").await?;
    match fence.write_value("k", FencingToken(6), b"6").await {
        Err(Error::Stale {
            presented, current, ..
        }) => ensure!(
            presented == FencingToken(6) && current == FencingToken(7),
            "Stale reported {presented} {current}"
        ),
        other => return Err(format!("token 6 after 7 gave {other:?}").into()),
    }
    fence.admit("k", FencingToken(9)).await?;
    let r = fence.write_value("k", FencingToken(8), b"8").await;
    ensure!(
        matches!(r, Err(Error::Stale { current, .. }) if current == FencingToken(9)),
        "token 8 after an admission of 9 gave {r:?}"
    );
    let read = fence.read_value("k").await?;
    ensure!(read == stored(7, b"7"), "a refused write changed {read:?}");
    ensure!(
        fence.highest("k").await? == Some(FencingToken(9)),
        "a refused write changed the highest token"
    );
    Ok(())
}

/// The value lives in the store, not in the writer's connection: a new
/// fence on a new connection reads it, and refuses the old token below it.
pub async fn value_survives_a_new_connection(store: &dyn Store) -> TestResult {
    let Some(writer) = values_fence(store).await? else {
        return Ok(());
    };
    writer
        .write_value("kept", FencingToken(3), br#"{"a":[1,2]}"#)
        .await?;
    drop(writer);
    let reader = fence_of(store).await?;
    let read = reader.read_value("kept").await?;
    ensure!(
        read == stored(3, br#"{"a":[1,2]}"#),
        "a new connection read {read:?}"
    );
    let r = reader.write_value("kept", FencingToken(2), b"2").await;
    ensure!(
        matches!(r, Err(Error::Stale { .. })),
        "a new connection admitted an older token: {r:?}"
    );
    Ok(())
}

/// Writers racing with different tokens on their own connections: the
/// value left is the highest token's, stored with that token, and every
/// refusal names a higher token.
pub async fn concurrent_writers_leave_the_highest_tokens_value(store: &dyn Store) -> TestResult {
    if values_fence(store).await?.is_none() {
        return Ok(());
    }
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let fence = fence_of(store).await?;
        // A scrambled order, so higher tokens do not simply arrive last.
        let token = FencingToken((i * 7919) % 16 + 1);
        tasks.push(tokio::spawn(async move {
            let value = format!(r#"{{"writer":{}}}"#, token.get());
            match fence.write_value("raced", token, value.as_bytes()).await {
                Ok(()) => Ok(true),
                Err(Error::Stale { current, .. }) if current > token => Ok(false),
                Err(e) => Err(e),
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await??);
    }
    ensure!(admitted >= 1, "no write was admitted");
    let read = fence_of(store).await?.read_value("raced").await?;
    ensure!(
        read == stored(16, br#"{"writer":16}"#),
        "the race left {read:?}"
    );
    Ok(())
}

/// A value of [`MAX_FENCED_VALUE`] bytes is stored whole; one byte more is
/// `InvalidArgument` and stores nothing, not even the admission.
pub async fn oversize_value_is_invalid(store: &dyn Store) -> TestResult {
    let Some(fence) = values_fence(store).await? else {
        return Ok(());
    };
    // A JSON string of exactly the limit.
    let largest = format!("\"{}\"", "x".repeat(MAX_FENCED_VALUE - 2));
    fence
        .write_value("big", FencingToken(1), largest.as_bytes())
        .await?;
    let read = fence.read_value("big").await?;
    ensure!(
        read == stored(1, largest.as_bytes()),
        "the largest value came back as {:?} bytes",
        read.map(|r| r.value.len())
    );
    let over = format!("\"{}\"", "x".repeat(MAX_FENCED_VALUE - 1));
    let r = fence
        .write_value("big", FencingToken(2), over.as_bytes())
        .await;
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "a value of {} bytes gave {r:?}",
        over.len()
    );
    ensure!(
        fence.highest("big").await? == Some(FencingToken(1)),
        "the refused write admitted its token"
    );
    Ok(())
}
