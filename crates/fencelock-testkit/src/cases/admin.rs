//! inspect, list, stats, release_all, force_release, waiting.

use std::time::Duration;

use fencelock_core::{AcquireRequest, Error};
use serde_json::json;

use super::{client, ensure, grant, key, long_ttl, owner, short_ttl, wait_out};
use crate::suite::{Store, TestResult};

/// inspect returns owner, token, kind, data and a sane expiry.
pub async fn inspect_reports_the_lease(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("workflow:123");
    ensure!(b.inspect(&k).await?.is_none(), "a fresh key has a lease");
    let data = json!({"job": "nightly", "attempt": 3, "tags": ["a", "ü"]});
    let req = AcquireRequest::new(k.clone(), owner("worker-1"), long_ttl())
        .with_kind(Some("workflow".into()))
        .with_data(Some(data.clone()));
    let g = match b.try_acquire(&req).await? {
        fencelock_core::Acquire::Granted(g) => g,
        held => return Err(format!("free key not granted: {held:?}").into()),
    };
    let info = b.inspect(&k).await?.ok_or("inspect found nothing")?;
    ensure!(
        info.key == k && info.owner == req.owner && info.token == g.token,
        "wrong lease: {info:?}"
    );
    ensure!(
        info.kind.as_deref() == Some("workflow"),
        "kind lost: {:?}",
        info.kind
    );
    ensure!(
        info.data.as_ref() == Some(&data),
        "data changed: {:?}",
        info.data
    );
    ensure!(
        info.acquired_at < info.expires_at,
        "acquired_at {} is not before expires_at {}",
        info.acquired_at,
        info.expires_at
    );
    ensure!(
        info.expires_in <= g.ttl && !info.expires_in.is_zero(),
        "expires_in {:?} for a {:?} lease",
        info.expires_in,
        g.ttl
    );
    Ok(())
}

/// list returns live leases under a literal prefix (no wildcard meaning for
/// `%`, `_`, `*`, `?`, `[`), sorted by key, and never expired ones.
pub async fn list_filters_by_literal_prefix(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let o = owner("lister");
    for name in [
        "job:b", "job:a", "job:%x", "jobs", "node:1", "j*b:1", "job_1", "job:[1]",
    ] {
        grant(&*b, &key(name), &o, long_ttl()).await?;
    }
    let gone = grant(&*b, &key("job:expired"), &o, short_ttl()).await?;
    wait_out(&*b, &key("job:expired"), &gone).await?;
    let names = |v: Vec<fencelock_core::LockInfo>| {
        v.into_iter().map(|i| i.key.to_string()).collect::<Vec<_>>()
    };
    let jobs = names(b.administer()?.list(Some("job:")).await?);
    ensure!(
        jobs == ["job:%x", "job:[1]", "job:a", "job:b"],
        "list(\"job:\") = {jobs:?}"
    );
    let wild = names(b.administer()?.list(Some("job%")).await?);
    ensure!(wild.is_empty(), "`%` acted as a wildcard: {wild:?}");
    let under = names(b.administer()?.list(Some("job_")).await?);
    ensure!(under == ["job_1"], "`_` acted as a wildcard: {under:?}");
    let star = names(b.administer()?.list(Some("j*")).await?);
    ensure!(star == ["j*b:1"], "`*` acted as a wildcard: {star:?}");
    let bracket = names(b.administer()?.list(Some("job:[")).await?);
    ensure!(
        bracket == ["job:[1]"],
        "`[` acted as a pattern: {bracket:?}"
    );
    let all = names(b.administer()?.list(None).await?);
    ensure!(all.len() == 8, "list(None) = {all:?}");
    ensure!(
        all.windows(2).all(|w| w[0] < w[1]),
        "list is not sorted: {all:?}"
    );
    Ok(())
}

/// stats count live leases by kind and owner; expired records are counted
/// until cleanup removes exactly those.
pub async fn stats_count_kinds_owners_and_expired(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let leases = [
        ("w1", "workflow", "alice"),
        ("w2", "workflow", "bob"),
        ("n1", "node", "alice"),
    ];
    for (k, kind, o) in leases {
        let req = AcquireRequest::new(key(k), owner(o), long_ttl()).with_kind(Some(kind.into()));
        ensure!(
            matches!(
                b.try_acquire(&req).await?,
                fencelock_core::Acquire::Granted(_)
            ),
            "{k} not granted"
        );
    }
    let plain = grant(&*b, &key("plain"), &owner("carol"), long_ttl()).await?;
    let short = grant(&*b, &key("short"), &owner("dave"), short_ttl()).await?;
    wait_out(&*b, &key("short"), &short).await?;
    let s = b.administer()?.stats().await?;
    ensure!(s.held == 4, "held = {} in {s:?}", s.held);
    ensure!(
        s.held_by_kind.get("workflow") == Some(&2)
            && s.held_by_kind.get("node") == Some(&1)
            && s.held_by_kind.get("") == Some(&1),
        "by kind: {:?}",
        s.held_by_kind
    );
    ensure!(
        s.held_by_owner.get("alice") == Some(&2)
            && s.held_by_owner.get("bob") == Some(&1)
            && !s.held_by_owner.contains_key("dave"),
        "by owner: {:?}",
        s.held_by_owner
    );
    let (avg, max) = (
        s.avg_hold_seconds.ok_or("no average")?,
        s.max_hold_seconds.ok_or("no maximum")?,
    );
    ensure!(avg >= 0.0 && max >= avg, "avg {avg} max {max}");
    let expected_expired = u64::from(b.capabilities().keeps_expired);
    ensure!(
        s.expired_not_cleaned == expected_expired,
        "expired_not_cleaned = {}, expected {expected_expired}",
        s.expired_not_cleaned
    );
    let cleaned = b.administer()?.cleanup_expired().await?;
    ensure!(
        cleaned == s.expired_not_cleaned,
        "cleanup removed {cleaned}, stats said {}",
        s.expired_not_cleaned
    );
    let s = b.administer()?.stats().await?;
    ensure!(
        s.expired_not_cleaned == 0 && s.held == 4,
        "after cleanup: {s:?}"
    );
    ensure!(
        b.inspect(&key("plain")).await?.map(|l| l.token) == Some(plain.token),
        "cleanup touched a live lease"
    );
    Ok(())
}

/// release_all removes one owner's leases and nobody else's.
pub async fn release_all_releases_only_that_owner(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let (gone, stays) = (owner("leaving"), owner("staying"));
    for i in 0..5 {
        grant(&*b, &key(&format!("ra-{i}")), &gone, long_ttl()).await?;
    }
    grant(&*b, &key("ra-other"), &stays, long_ttl()).await?;
    ensure!(
        b.administer()?.release_all(&gone).await? == 5,
        "release_all did not report 5"
    );
    ensure!(
        b.administer()?.release_all(&gone).await? == 0,
        "second release_all found more"
    );
    let left = b.administer()?.list(Some("ra-")).await?;
    ensure!(left.len() == 1 && left[0].owner == stays, "left: {left:?}");
    Ok(())
}

/// force_release removes any holder's lease and reports it.
pub async fn force_release_removes_any_holder(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let k = key("force");
    let g = grant(&*b, &k, &owner("stuck"), long_ttl()).await?;
    let removed = b
        .administer()?
        .force_release(&k)
        .await?
        .ok_or("force_release reported nothing")?;
    ensure!(removed.token == g.token, "removed {removed:?}");
    ensure!(b.inspect(&k).await?.is_none(), "the lease is still there");
    ensure!(
        b.administer()?.force_release(&k).await?.is_none(),
        "a second force_release found a lease"
    );
    let next = grant(&*b, &k, &owner("next"), long_ttl()).await?;
    ensure!(
        next.token > g.token,
        "token after force_release: {} <= {}",
        next.token,
        g.token
    );
    Ok(())
}

/// A waiter blocked on a held key gets it after the holder releases, well
/// before the holder's lease would have expired.
pub async fn waiter_gets_lock_after_release(store: &dyn Store) -> TestResult {
    let holder = client(store, "holder").await?;
    let waiter = client(store, "waiter").await?;
    let first = holder.lock("handoff").ttl(long_ttl()).acquire().await?;
    let waiting = tokio::spawn(async move {
        waiter
            .lock("handoff")
            .ttl(long_ttl())
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    // Whether the waiter is already waiting or not yet started, it can only
    // get the key through this release: the lease outlasts its wait.
    let t1 = first.token();
    first.release().await?;
    let second = waiting.await??;
    ensure!(
        second.token() > t1,
        "waiter's token {} <= {t1}",
        second.token()
    );
    ensure!(
        second.owner().as_str() == "waiter",
        "owner {}",
        second.owner()
    );
    second.release().await?;
    Ok(())
}

/// A held key gives `Timeout` after the wait, not a hang.
pub async fn wait_times_out_while_held(store: &dyn Store) -> TestResult {
    let holder = client(store, "holder").await?;
    let waiter = client(store, "waiter").await?;
    let _held = holder.lock("timeout").ttl(long_ttl()).acquire().await?;
    let started = tokio::time::Instant::now();
    let result = waiter
        .lock("timeout")
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    ensure!(
        matches!(result, Err(Error::Timeout { .. })),
        "expected Timeout, got {result:?}"
    );
    ensure!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up before the wait ended"
    );
    ensure!(
        waiter.try_lock("timeout").await?.is_none(),
        "try_lock on a held key returned a guard"
    );
    Ok(())
}
