//! I3 ownership, I4 backend time, I6 no janitor.

use std::time::Duration;

use fencelock_core::{Acquire, Error};

use super::{ensure, grant, key, lease, long_ttl, owner, released, request, short_ttl, wait_out};
use crate::suite::{Store, TestResult};

/// Another owner, with or without the right token, can neither renew nor
/// release; the lease is unchanged.
pub async fn i3_stranger_cannot_renew_or_release(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let other = store.connect().await?;
    let k = key("i3-stranger");
    let (holder, stranger) = (owner("holder"), owner("stranger"));
    let g = grant(&*b, &k, &holder, long_ttl()).await?;
    let before = b.inspect(&k).await?.ok_or("lease missing")?;
    let renew = other
        .renew(&lease(&k, &stranger, g.token), long_ttl())
        .await;
    ensure!(
        matches!(renew, Err(Error::NotHeld { .. })),
        "a stranger renewed: {renew:?}"
    );
    ensure!(
        !released(&*other, &k, &stranger, g.token).await?,
        "a stranger released"
    );
    // The right owner with a wrong token is a stranger too.
    let wrong = fencelock_core::FencingToken(g.token.0.wrapping_add(1));
    let renew = other.renew(&lease(&k, &holder, wrong), long_ttl()).await;
    ensure!(
        matches!(renew, Err(Error::NotHeld { .. })),
        "a wrong token renewed: {renew:?}"
    );
    ensure!(
        !released(&*other, &k, &holder, wrong).await?,
        "a wrong token released"
    );
    let after = b.inspect(&k).await?.ok_or("the lease vanished")?;
    ensure!(
        after.owner == before.owner
            && after.token == before.token
            && after.expires_at <= before.expires_at,
        "the lease changed: {before:?} -> {after:?}"
    );
    Ok(())
}

/// A holder whose lease expired and was taken over by a successor with the
/// *same owner name* cannot renew or release the successor's lease.
pub async fn i3_stale_holder_cannot_touch_successor(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("i3-stale");
    let o = owner("same-name");
    let stale = grant(&*b, &k, &o, short_ttl()).await?;
    wait_out(&*b, &k, &stale).await?;
    let successor = grant(&*b, &k, &o, long_ttl()).await?;
    let renew = b.renew(&lease(&k, &o, stale.token), long_ttl()).await;
    ensure!(
        matches!(renew, Err(Error::NotHeld { .. })),
        "the stale holder renewed: {renew:?}"
    );
    ensure!(
        !released(&*b, &k, &o, stale.token).await?,
        "the stale holder released its successor"
    );
    let lease = b
        .inspect(&k)
        .await?
        .ok_or("the successor's lease vanished")?;
    ensure!(
        lease.token == successor.token,
        "the lease is {lease:?}, expected token {}",
        successor.token
    );
    Ok(())
}

/// Release and renew of an expired lease say "not held".
pub async fn release_after_expiry_is_not_held(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("expired-release");
    let o = owner("o");
    let g = grant(&*b, &k, &o, short_ttl()).await?;
    wait_out(&*b, &k, &g).await?;
    let renew = b.renew(&lease(&k, &o, g.token), long_ttl()).await;
    ensure!(
        matches!(renew, Err(Error::NotHeld { .. })),
        "an expired lease was renewed: {renew:?}"
    );
    ensure!(
        !released(&*b, &k, &o, g.token).await?,
        "release of an expired lease returned true"
    );
    Ok(())
}

/// The lease holds for its whole TTL on the backend's clock, and the moment
/// it ends anyone can take it, without cleanup.
pub async fn i4_i6_expiry_needs_no_cleanup(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("i6");
    let t_sent = tokio::time::Instant::now();
    let g = grant(&*b, &k, &owner("first"), short_ttl()).await?;
    let next = owner("next");
    let bound = g.ttl + super::patient(Duration::from_secs(5));
    loop {
        match b.try_acquire(&request(&k, &next, long_ttl())).await? {
            Acquire::Granted(taken) => {
                // The lease may not end before its TTL has passed locally
                // (which starts before the backend's), allowing 1% drift.
                let held_for = t_sent.elapsed();
                ensure!(
                    held_for >= g.ttl.mul_f64(0.99),
                    "lease of {:?} ended after only {held_for:?}",
                    g.ttl
                );
                ensure!(
                    taken.token > g.token,
                    "takeover token {} <= {}",
                    taken.token,
                    g.token
                );
                return Ok(());
            }
            Acquire::Held(_) => ensure!(
                t_sent.elapsed() < bound,
                "the expired lease was never taken over"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
