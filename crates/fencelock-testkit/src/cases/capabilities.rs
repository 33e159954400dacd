//! The operations that grew the trait after the exclusive lock: batched
//! renewal, token floors, holder-change streams, release wake-ups and
//! `LockClient::close`. Every backend runs every case: where it claims a
//! capability the case checks that the claim holds, and where it does not,
//! that the operation is refused with a typed error rather than ignored.

use std::time::Duration;

use fencelock_core::{
    Acquire, AcquireRequest, Error, FencingToken, HolderChange, LossReason, Renewal, Watch,
};

use super::{client, ensure, grant, key, lease, long_ttl, owner, request, short_ttl};
use crate::suite::{Store, TestResult};

/// How long a claimed signal (a wake-up, a holder change) may take.
fn signal_bound() -> Duration {
    super::patient(Duration::from_secs(10))
}

/// `renew_many` answers one result per lease, in order: the held ones are
/// extended with their tokens kept (for as long as the backend grants when
/// asked for the long TTL: a session-bound one may grant less), a stale one
/// is `NotHeld`, and an empty batch is an empty answer.
pub async fn renew_many_answers_each_lease(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let o = owner("batch");
    let (k1, k2, k3) = (key("batch:1"), key("batch:2"), key("batch:3"));
    let g1 = grant(&*b, &k1, &o, short_ttl()).await?;
    let g2 = grant(&*b, &k2, &o, short_ttl()).await?;
    let g3 = grant(&*b, &k3, &o, long_ttl()).await?;
    ensure!(
        g3.ttl >= long_ttl() || (b.capabilities().session_bound && g3.ttl > short_ttl()),
        "asked for {:?}, granted {:?}",
        long_ttl(),
        g3.ttl
    );
    let stale = FencingToken(g3.token.get() - 1);
    let answers = b
        .renew_many(&[
            Renewal::new(lease(&k1, &o, g1.token), long_ttl()),
            Renewal::new(lease(&k3, &o, stale), long_ttl()),
            Renewal::new(lease(&k2, &o, g2.token), long_ttl()),
        ])
        .await?;
    ensure!(answers.len() == 3, "{} answers for 3 leases", answers.len());
    let mut answers = answers.into_iter();
    match answers.next() {
        Some(Ok(renewed)) => ensure!(
            renewed.token == g1.token && renewed.ttl >= long_ttl().min(g3.ttl),
            "{k1} renewed as {renewed:?} (a grant of {:?} was {:?})",
            long_ttl(),
            g3.ttl
        ),
        other => return Err(format!("{k1}: {other:?}").into()),
    }
    match answers.next() {
        Some(Err(Error::NotHeld { .. })) => {}
        other => return Err(format!("the stale lease was answered {other:?}").into()),
    }
    match answers.next() {
        Some(Ok(renewed)) => ensure!(renewed.token == g2.token, "{k2} renewed as {renewed:?}"),
        other => return Err(format!("{k2}: {other:?}").into()),
    }
    // Renewed to the long TTL: still held well after the short one ended.
    tokio::time::sleep(g1.ttl.max(g2.ttl) + Duration::from_millis(200)).await;
    for (k, g) in [(&k1, &g1), (&k2, &g2)] {
        let info = b.inspect(k).await?;
        ensure!(
            info.as_ref().is_some_and(|i| i.token == g.token),
            "{k} was not extended by renew_many: {info:?}"
        );
    }
    let empty = b.renew_many(&[]).await?;
    ensure!(empty.is_empty(), "an empty batch was answered {empty:?}");
    Ok(())
}

/// A backend that claims `min_token` grants above the floor and keeps I2
/// afterwards; one that does not is never sent a floor (the client refuses
/// it with `Unsupported`).
pub async fn min_token_floor_is_honoured_or_refused(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let o = owner("floor");
    let k = key("floor");
    if !b.capabilities().min_token {
        let c = client(store, "floor").await?;
        let refused = c
            .lock("floor")
            .min_token(FencingToken(1_000))
            .acquire()
            .await;
        ensure!(
            matches!(refused, Err(Error::Unsupported(_))),
            "a floor on a backend without min_token gave {refused:?}"
        );
        return Ok(());
    }
    let first = grant(&*b, &k, &o, long_ttl()).await?;
    b.release(&lease(&k, &o, first.token)).await?;
    let floor = FencingToken(first.token.get() + 1_000_000);
    let floored = match b
        .try_acquire(&request(&k, &o, long_ttl()).with_min_token(Some(floor)))
        .await?
    {
        Acquire::Granted(g) => g,
        held => return Err(format!("free key not granted with a floor: {held:?}").into()),
    };
    ensure!(
        floored.token > floor,
        "token {} is not above the floor {floor}",
        floored.token
    );
    // A floor on a held key changes nothing.
    let rival = AcquireRequest::new(k.clone(), owner("rival"), long_ttl())
        .with_min_token(Some(FencingToken(floor.get() * 2)));
    ensure!(
        matches!(b.try_acquire(&rival).await?, Acquire::Held(_)),
        "a floor took a held key"
    );
    b.release(&lease(&k, &o, floored.token)).await?;
    let after = grant(&*b, &k, &o, long_ttl()).await?;
    ensure!(
        after.token > floored.token,
        "token {} after a floored grant {} (I2)",
        after.token,
        floored.token
    );
    // A floor below the key's tokens does not lower them.
    b.release(&lease(&k, &o, after.token)).await?;
    let low = match b
        .try_acquire(&request(&k, &o, long_ttl()).with_min_token(Some(FencingToken(1))))
        .await?
    {
        Acquire::Granted(g) => g,
        held => return Err(format!("free key not granted: {held:?}").into()),
    };
    ensure!(low.token > after.token, "a low floor lowered the token");
    Ok(())
}

/// A backend that claims `watch` reports an acquisition, a release and an
/// expiry of the watched key, in order; one that does not answers
/// `Unsupported`.
pub async fn watch_reports_acquire_release_and_expiry(store: &dyn Store) -> TestResult {
    let watcher = store.connect().await?;
    let k = key("watched");
    if !watcher.capabilities().watch {
        let refused = watcher.watch(&k).await;
        ensure!(
            matches!(refused, Err(Error::Unsupported(_))),
            "watch without the capability gave {:?}",
            refused.map(|_| "a stream")
        );
        return Ok(());
    }
    let changes = watcher.watch(&k).await?;
    sees_acquire_release_and_expiry(store, changes, "watched").await
}

/// Takes `name` for a long TTL, releases it, takes it for a short one and
/// lets it expire, checking that `changes` (a watch of `name` made before)
/// reports each step, in order.
async fn sees_acquire_release_and_expiry(
    store: &dyn Store,
    mut changes: Watch,
    name: &str,
) -> TestResult {
    let b = store.connect().await?;
    let (k, o) = (key(name), owner("holder"));
    let g = grant(&*b, &k, &o, long_ttl()).await?;
    let seen = next_change(&mut changes).await?;
    ensure!(
        matches!(seen, HolderChange::Acquired(ref i) if i.token == g.token && i.owner == o),
        "expected the acquisition of token {}, saw {seen:?}",
        g.token
    );
    b.release(&lease(&k, &o, g.token)).await?;
    let seen = next_change(&mut changes).await?;
    ensure!(
        seen == HolderChange::Released(lease(&k, &o, g.token)),
        "expected the release, saw {seen:?}"
    );
    let short = grant(&*b, &k, &o, short_ttl()).await?;
    let seen = next_change(&mut changes).await?;
    ensure!(
        matches!(seen, HolderChange::Acquired(ref i) if i.token == short.token),
        "expected the second acquisition, saw {seen:?}"
    );
    let seen = next_change(&mut changes).await?;
    ensure!(
        seen == HolderChange::Expired(lease(&k, &o, short.token)),
        "expected the expiry of token {}, saw {seen:?}",
        short.token
    );
    Ok(())
}

/// The next change of `watch`, within [`signal_bound`].
async fn next_change(watch: &mut Watch) -> TestResult<HolderChange> {
    match tokio::time::timeout(signal_bound(), watch.next()).await {
        Ok(Some(change)) => Ok(change?),
        Ok(None) => Err("the watch ended".into()),
        Err(_) => Err(format!("no holder change within {:?}", signal_bound()).into()),
    }
}

/// A backend that claims `wakeups` wakes a subscriber when another
/// connection releases the key.
pub async fn wakeups_claim_holds(store: &dyn Store) -> TestResult {
    let waiter = store.connect().await?;
    let k = key("woken");
    let subscription = waiter.subscribe(&k).await?;
    let Some(mut subscription) = subscription else {
        ensure!(
            !waiter.capabilities().wakeups,
            "wakeups claimed, but subscribe gave no subscription"
        );
        return Ok(());
    };
    if !waiter.capabilities().wakeups {
        return Ok(());
    }
    let b = store.connect().await?;
    let o = owner("holder");
    let g = grant(&*b, &k, &o, long_ttl()).await?;
    b.release(&lease(&k, &o, g.token)).await?;
    let woken = tokio::time::timeout(signal_bound(), subscription.woken()).await;
    ensure!(
        matches!(woken, Ok(true)),
        "wakeups claimed, but a release woke nobody within {:?} ({woken:?})",
        signal_bound()
    );
    Ok(())
}

/// `LockClient::close` releases every lease of the client (other
/// connections see the keys free), tells each guard why, and refuses new
/// acquisitions.
pub async fn close_releases_every_lease(store: &dyn Store) -> TestResult {
    let c = client(store, "closing").await?;
    let a = c.lock("close:a").ttl(long_ttl()).acquire().await?;
    let b = c.clone().lock("close:b").ttl(long_ttl()).acquire().await?;
    c.close().await?;
    let other = store.connect().await?;
    for k in ["close:a", "close:b"] {
        let info = other.inspect(&key(k)).await?;
        ensure!(info.is_none(), "{k} still held after close: {info:?}");
    }
    ensure!(
        a.loss_reason() == Some(LossReason::Closed) && !b.is_valid(),
        "guards after close: {a:?} {b:?}"
    );
    a.release().await?;
    drop(b);
    let refused = c.lock("close:c").acquire().await;
    ensure!(
        matches!(refused, Err(Error::ClientClosed)),
        "acquire after close gave {refused:?}"
    );
    Ok(())
}

/// A backend that claims `set_data` replaces the holder's data in place
/// (token, owner and lease kept; `inspect` shows the new data) and answers
/// `NotHeld` to a stale token, another owner and a released lease; one that
/// does not answers `Unsupported`, and so does a leader's `proclaim`.
pub async fn set_data_replaces_the_holders_data_or_is_refused(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let (k, o) = (key("proclaimed"), owner("holder"));
    let g = match b
        .try_acquire(&request(&k, &o, long_ttl()).with_data(Some(serde_json::json!({"v": 1}))))
        .await?
    {
        Acquire::Granted(g) => g,
        held => return Err(format!("free key not granted: {held:?}").into()),
    };
    let mine = lease(&k, &o, g.token);
    if !b.capabilities().set_data {
        let refused = b.set_data(&mine, Some(serde_json::json!(2))).await;
        ensure!(
            matches!(refused, Err(Error::Unsupported(_))),
            "set_data without the capability gave {refused:?}"
        );
        let c = client(store, "leader").await?;
        let leadership = c.election("unsupported").ttl(long_ttl()).campaign().await?;
        let refused = leadership.proclaim(serde_json::json!(2)).await;
        ensure!(
            matches!(refused, Err(Error::Unsupported(_))),
            "proclaim without set_data gave {refused:?}"
        );
        return Ok(());
    }
    let other = store.connect().await?;
    other
        .set_data(&mine, Some(serde_json::json!({"v": 2, "s": "ü"})))
        .await?;
    let info = other.inspect(&k).await?.ok_or("the lease vanished")?;
    ensure!(
        info.data == Some(serde_json::json!({"v": 2, "s": "ü"}))
            && info.token == g.token
            && info.owner == o,
        "after set_data the lease is {info:?} (token {})",
        g.token
    );
    for wrong in [
        lease(&k, &o, FencingToken(g.token.get() - 1)),
        lease(&k, &o, FencingToken(g.token.get() + 1)),
        lease(&k, &owner("stranger"), g.token),
    ] {
        let refused = other.set_data(&wrong, Some(serde_json::json!(3))).await;
        ensure!(
            matches!(refused, Err(Error::NotHeld { .. })),
            "set_data for {wrong} gave {refused:?}"
        );
    }
    b.set_data(&mine, None).await?;
    let info = other.inspect(&k).await?.ok_or("the lease vanished")?;
    ensure!(
        info.data.is_none() && info.token == g.token,
        "after clearing the data the lease is {info:?}"
    );
    // Still renewable as the same lease, data intact.
    b.set_data(&mine, Some(serde_json::json!("kept"))).await?;
    let renewed = b.renew(&mine, long_ttl()).await?;
    ensure!(renewed.token == g.token, "renewal changed the token");
    let info = other.inspect(&k).await?;
    ensure!(
        info.as_ref().and_then(|i| i.data.clone()) == Some(serde_json::json!("kept")),
        "renewal lost the data: {info:?}"
    );
    b.release(&mine).await?;
    let refused = b.set_data(&mine, Some(serde_json::json!(4))).await;
    ensure!(
        matches!(refused, Err(Error::NotHeld { .. })),
        "set_data after release gave {refused:?}"
    );
    Ok(())
}

/// `LockClient::watch` reports an acquisition, a release and an expiry on
/// every backend: natively where `watch` is claimed, by polling elsewhere.
pub async fn client_watch_sees_acquire_release_and_expiry(store: &dyn Store) -> TestResult {
    let c = client(store, "watcher").await?;
    let changes = c.watch("client-watched").await?;
    sees_acquire_release_and_expiry(store, changes, "client-watched").await
}
