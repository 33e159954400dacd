//! Lock delay (`docs/lock-delay.md`): a lock taken with `hold_at_least(d)`
//! keeps others out until d after the grant, however early it is released.

use std::time::Duration;

use fencelock_core::Error;

use super::{client, ensure, expiry_slack};
use crate::suite::{Store, TestResult};

/// The delay of the first case: long enough that the checks made right
/// after the release nearly always fall inside it (they are skipped when a
/// stalled machine let it pass), short enough to wait out.
const DELAY: Duration = Duration::from_secs(3);

/// Released at once, the key stays held by the same lease (same token) and
/// refuses others until the delay has passed; a waiter then gets it with a
/// higher token.
pub async fn early_release_keeps_the_key_for_the_delay(store: &dyn Store) -> TestResult {
    let a = client(store, "delay-a").await?;
    let b = client(store, "delay-b").await?;
    let started = tokio::time::Instant::now();
    let guard = a
        .lock("delay-key")
        .ttl(DELAY)
        .hold_at_least(DELAY)
        .acquire()
        .await?;
    let token = guard.token();
    guard.release().await?;
    let shown = b.inspect("delay-key").await?;
    let refused = b.try_lock("delay-key").await?;
    // The lease ends no earlier than the grant plus the delay, and the
    // grant came after `started`: before `started + DELAY` it must be held.
    if started.elapsed() < DELAY {
        ensure!(
            shown.as_ref().is_some_and(|l| l.token == token),
            "released inside its delay, the lease is gone: {shown:?}"
        );
        ensure!(
            refused.is_none(),
            "another owner took the key inside the delay"
        );
    }
    drop(refused);
    let next = b
        .lock("delay-key")
        .wait(DELAY * 3 + expiry_slack())
        .acquire()
        .await?;
    ensure!(
        next.token() > token,
        "token {} after the delayed lease {token}",
        next.token()
    );
    next.release().await?;
    Ok(())
}

/// Released after its delay has passed, the key is free at once.
pub async fn release_after_the_delay_frees_at_once(store: &dyn Store) -> TestResult {
    let a = client(store, "delay-late").await?;
    let delay = Duration::from_millis(200);
    let guard = a
        .lock("delay-late")
        .ttl(Duration::from_secs(60))
        .hold_at_least(delay)
        .acquire()
        .await?;
    // The delay counts from the grant, which came before this sleep began.
    tokio::time::sleep(delay).await;
    guard.release().await?;
    let shown = a.inspect("delay-late").await?;
    ensure!(
        shown.is_none(),
        "released after its delay, the key is still held: {shown:?}"
    );
    Ok(())
}

/// A delay of zero or longer than the TTL is refused before anything is
/// taken.
pub async fn bad_delays_are_refused(store: &dyn Store) -> TestResult {
    let a = client(store, "delay-bad").await?;
    for (ttl, delay) in [
        (Duration::from_secs(5), Duration::ZERO),
        (Duration::from_secs(5), Duration::from_secs(6)),
    ] {
        let refused = a
            .lock("delay-bad")
            .ttl(ttl)
            .hold_at_least(delay)
            .acquire()
            .await;
        ensure!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "hold_at_least {delay:?} with ttl {ttl:?} gave {refused:?}"
        );
    }
    ensure!(
        a.inspect("delay-bad").await?.is_none(),
        "a refused request took the key"
    );
    Ok(())
}
