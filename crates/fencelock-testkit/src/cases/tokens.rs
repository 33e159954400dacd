//! I2: every grant's token is above every token issued for the key before.

use std::time::Duration;

use fencelock_core::{Acquire, Error, FencingToken};

use super::{
    client, ensure, grant, key, lease, long_ttl, owner, released, request, short_ttl, wait_out,
};
use crate::suite::{Store, TestResult};

fn strictly_increasing(tokens: &[FencingToken]) -> bool {
    tokens.windows(2).all(|w| w[0] < w[1])
}

/// acquire/release cycles by alternating owners.
pub async fn i2_grow_across_release(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("i2-release");
    let mut tokens = Vec::new();
    for i in 0..20 {
        let o = owner(&format!("owner-{}", i % 3));
        let g = grant(&*b, &k, &o, long_ttl()).await?;
        tokens.push(g.token);
        ensure!(
            released(&*b, &k, &o, g.token).await?,
            "release of a held lease returned false"
        );
    }
    ensure!(
        strictly_increasing(&tokens),
        "tokens did not strictly grow: {tokens:?}"
    );
    Ok(())
}

/// acquire, let it expire, acquire again (a takeover by another owner and a
/// re-acquire by the same owner).
pub async fn i2_grow_across_expiry_and_takeover(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("i2-expiry");
    let a = owner("a");
    let first = grant(&*b, &k, &a, short_ttl()).await?;
    wait_out(&*b, &k, &first).await?;
    let second = grant(&*b, &k, &owner("b"), short_ttl()).await?;
    wait_out(&*b, &k, &second).await?;
    let third = grant(&*b, &k, &a, long_ttl()).await?;
    let tokens = [first.token, second.token, third.token];
    ensure!(
        strictly_increasing(&tokens),
        "tokens did not strictly grow: {tokens:?}"
    );
    Ok(())
}

/// Released and expired records deleted by cleanup do not take their token
/// history with them.
pub async fn i2_grow_across_cleanup(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let (released, expired) = (key("i2-cleanup-released"), key("i2-cleanup-expired"));
    let o = owner("cleaner");
    let g1 = grant(&*b, &released, &o, long_ttl()).await?;
    ensure!(
        super::released(&*b, &released, &o, g1.token).await?,
        "release failed"
    );
    let g2 = grant(&*b, &expired, &o, short_ttl()).await?;
    wait_out(&*b, &expired, &g2).await?;
    b.administer()?.cleanup_expired().await?;
    ensure!(
        b.administer()?.stats().await?.expired_not_cleaned == 0,
        "cleanup left expired records"
    );
    let after_released = grant(&*b, &released, &owner("next"), long_ttl()).await?;
    let after_expired = grant(&*b, &expired, &owner("next"), long_ttl()).await?;
    ensure!(
        after_released.token > g1.token,
        "after cleanup: {} <= {}",
        after_released.token,
        g1.token
    );
    ensure!(
        after_expired.token > g2.token,
        "after cleanup: {} <= {}",
        after_expired.token,
        g2.token
    );
    Ok(())
}

/// A new connection (a new process, for file-backed stores) continues the
/// token sequence.
pub async fn i2_grow_across_reconnect(store: &dyn Store) -> TestResult {
    let k = key("i2-reconnect");
    let o = owner("o");
    let before = {
        let b = store.connect().await?;
        let g = grant(&*b, &k, &o, long_ttl()).await?;
        ensure!(released(&*b, &k, &o, g.token).await?, "release failed");
        g.token
    };
    let b = store.connect().await?;
    let after = grant(&*b, &k, &o, long_ttl()).await?;
    ensure!(
        after.token > before,
        "after reconnect: {} <= {before}",
        after.token
    );
    Ok(())
}

/// A restart of the server (or a reopen of the file) keeps tokens growing,
/// for a released key and for one whose lease was live at the restart.
pub async fn i2_grow_across_restart(store: &dyn Store) -> TestResult {
    let (free, live) = (key("i2-restart-free"), key("i2-restart-live"));
    let o = owner("o");
    let (t_free, t_live, live_ttl) = {
        let b = store.connect().await?;
        let g = grant(&*b, &free, &o, long_ttl()).await?;
        ensure!(released(&*b, &free, &o, g.token).await?, "release failed");
        let live_grant = grant(&*b, &live, &o, short_ttl()).await?;
        (g.token, live_grant.token, live_grant.ttl)
    };
    store.restart().await?;
    let b = store.connect().await?;
    let after_free = retry_grant(&*b, &free, long_ttl(), Duration::from_secs(30)).await?;
    ensure!(
        after_free > t_free,
        "after restart: {after_free} <= {t_free}"
    );
    // The live lease may or may not have survived the restart, depending on
    // the backend's durability; once it is gone, the next token is higher.
    let after_live =
        retry_grant(&*b, &live, long_ttl(), live_ttl + Duration::from_secs(30)).await?;
    ensure!(
        after_live > t_live,
        "after restart: {after_live} <= {t_live}"
    );
    Ok(())
}

/// Retries a grant through transient errors (reconnects) and held answers.
async fn retry_grant(
    b: &dyn fencelock_core::Backend,
    k: &fencelock_core::LockKey,
    ttl: Duration,
    bound: Duration,
) -> TestResult<FencingToken> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let last = match b
            .try_acquire(&super::request(k, &owner("after-restart"), ttl))
            .await
        {
            Ok(fencelock_core::Acquire::Granted(g)) => return Ok(g.token),
            Ok(held) => format!("{held:?}"),
            Err(e) if e.is_transient() => e.to_string(),
            Err(e) => return Err(e.into()),
        };
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no grant on {k} within {bound:?} of the restart; last answer: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Renewal extends the lease and keeps the token.
pub async fn renewal_keeps_token(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("renew");
    let o = owner("o");
    let g = grant(&*b, &k, &o, short_ttl()).await?;
    let mut last_expiry = g.expires_at;
    for _ in 0..3 {
        let r = b.renew(&lease(&k, &o, g.token), long_ttl()).await?;
        ensure!(
            r.token == g.token,
            "renewal changed the token: {} -> {}",
            g.token,
            r.token
        );
        ensure!(
            r.expires_at >= last_expiry,
            "renewal moved expiry backwards"
        );
        last_expiry = r.expires_at;
    }
    // Past the original short TTL, the renewed lease still holds.
    tokio::time::sleep(g.ttl + Duration::from_millis(100)).await;
    let lease = b
        .inspect(&k)
        .await?
        .ok_or("the renewed lease expired with its first TTL")?;
    ensure!(
        lease.token == g.token && lease.owner == o,
        "inspect shows {lease:?}"
    );
    Ok(())
}

/// Floors stop at [`FencingToken::MAX_FLOOR`] on every backend that takes
/// them (a higher one is bad input, through the backend and through the
/// client), and a floor near it neither repeats a token nor ends the
/// store: the floored key keeps counting up exactly, and other keys are
/// granted as before.
pub async fn floors_are_bounded_and_tokens_never_repeat(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    if !b.capabilities().min_token {
        return Ok(());
    }
    let o = owner("floor-top");
    let k = key("floor-top");
    // Just below 2^53, where Lua's doubles used to round two draws into
    // one token, and the last signed 64-bit values, where a counter used
    // to end for every key.
    for too_high in [
        FencingToken::MAX_FLOOR.get() + 1,
        FencingToken::MAX.get() - 2,
        i64::MAX as u64 - 1,
        u64::MAX,
    ] {
        let refused = b
            .try_acquire(&request(&k, &o, long_ttl()).with_min_token(Some(FencingToken(too_high))))
            .await;
        ensure!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "floor {too_high} through the backend gave {refused:?}"
        );
        let c = client(store, "floor-top").await?;
        let refused = c
            .lock(k.as_str())
            .min_token(FencingToken(too_high))
            .try_acquire()
            .await;
        ensure!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "floor {too_high} through the client gave {refused:?}"
        );
    }
    // High, but a little below the cap: a sharded map in transition floors
    // the second shard with the first one's token, which must itself be a
    // floor the second shard accepts.
    let high = FencingToken(FencingToken::MAX_FLOOR.get() - 1_000_000);
    let mut tokens = Vec::new();
    for i in 0..5 {
        let floor = (i == 0).then_some(high);
        let g = match b
            .try_acquire(&request(&k, &o, long_ttl()).with_min_token(floor))
            .await?
        {
            Acquire::Granted(g) => g,
            held => return Err(format!("free key not granted: {held:?}").into()),
        };
        ensure!(
            g.token > high && g.token <= FencingToken::MAX,
            "token {} after a floor of {high} is outside ({high}, {}]",
            g.token,
            FencingToken::MAX
        );
        tokens.push(g.token);
        ensure!(
            released(&*b, &k, &o, g.token).await?,
            "release of a held lease returned false"
        );
    }
    ensure!(
        strictly_increasing(&tokens),
        "tokens after a top floor did not strictly grow: {tokens:?}"
    );
    let other = key("floor-top-other");
    let g = grant(&*b, &other, &o, long_ttl()).await?;
    ensure!(
        g.token <= FencingToken::MAX,
        "another key's token {} is past the limit",
        g.token
    );
    Ok(())
}
