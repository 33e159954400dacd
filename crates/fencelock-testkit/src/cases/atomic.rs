//! Atomic multi-key acquisition (`docs/multi-key.md`): a backend that
//! claims `atomic_multi` takes every key of `try_acquire_all` or none, with
//! a token per key; `lock_all` keeps the same promises on every backend.

use std::time::Duration;

use fencelock_core::{AcquireAll, AcquireRequest, Error, FencingToken};

use super::{client, ensure, grant, key, lease, long_ttl, owner, request};
use crate::suite::{Store, TestResult};

/// The claim holds: with `atomic_multi` a set of free keys is granted in
/// one call, each lease as `inspect` shows it, and a set with one held key
/// is refused naming it; without it, `try_acquire_all` is `Unsupported`.
pub async fn claim_holds(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let o = owner("atomic-claim");
    let keys = [key("claim-a"), key("claim-b"), key("claim-c")];
    let requests: Vec<AcquireRequest> = keys.iter().map(|k| request(k, &o, long_ttl())).collect();
    if !b.capabilities().atomic_multi {
        let answer = b.try_acquire_all(&requests).await;
        ensure!(
            matches!(answer, Err(Error::Unsupported(_))),
            "try_acquire_all without the atomic_multi claim gave {answer:?}"
        );
        return Ok(());
    }
    let grants = match b.try_acquire_all(&requests).await? {
        AcquireAll::Granted(grants) => grants,
        held => return Err(format!("free keys not granted: {held:?}").into()),
    };
    ensure!(grants.len() == 3, "{} grants for 3 keys", grants.len());
    for (k, g) in keys.iter().zip(&grants) {
        let shown = b.inspect(k).await?.ok_or("a granted key is not held")?;
        ensure!(
            shown.token == g.token && shown.owner == o,
            "{k}: granted {}, backend shows {shown:?}",
            g.token
        );
    }
    // Every key is now held by `o`: another owner gets the first one named.
    let rival = owner("atomic-rival");
    let theirs: Vec<AcquireRequest> = keys
        .iter()
        .map(|k| request(k, &rival, long_ttl()))
        .collect();
    match b.try_acquire_all(&theirs).await? {
        AcquireAll::Held { index, .. } => ensure!(index == 0, "held at index {index}, not 0"),
        granted => return Err(format!("held keys granted to a rival: {granted:?}").into()),
    }
    for (k, g) in keys.iter().zip(&grants) {
        b.release(&lease(k, &o, g.token)).await?;
    }
    Ok(())
}

/// One key of the set held by another owner: nothing is granted, the other
/// keys stay free, and the holder's lease is untouched. Through the backend
/// where it claims `atomic_multi`, through `lock_all` everywhere.
pub async fn all_or_nothing_under_contention(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let holder = owner("aon-holder");
    let taker = owner("aon-taker");
    let keys = [key("aon-a"), key("aon-b"), key("aon-c")];
    let held = grant(&*b, &keys[1], &holder, long_ttl()).await?;
    if b.capabilities().atomic_multi {
        let requests: Vec<AcquireRequest> = keys
            .iter()
            .map(|k| request(k, &taker, long_ttl()))
            .collect();
        match b.try_acquire_all(&requests).await? {
            AcquireAll::Held { index, holder: who } => {
                ensure!(index == 1, "held at index {index}, not 1");
                if let Some(who) = who {
                    ensure!(
                        who.owner == holder && who.token == held.token,
                        "reported holder {who:?}"
                    );
                }
            }
            granted => return Err(format!("a held key was granted: {granted:?}").into()),
        }
        for k in [&keys[0], &keys[2]] {
            let left = b.inspect(k).await?;
            ensure!(
                left.is_none(),
                "a refused atomic call left {k} held: {left:?}"
            );
        }
    }
    let c = client(store, "aon-taker").await?;
    let none = c
        .lock_all(["aon-c", "aon-b", "aon-a"])
        .ttl(long_ttl())
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    ensure!(
        matches!(&none, Err(Error::Timeout { key, .. }) if key.as_str() == "aon-b"),
        "lock_all with a held key gave {none:?}"
    );
    for k in [&keys[0], &keys[2]] {
        let left = b.inspect(k).await?;
        ensure!(left.is_none(), "a failed lock_all left {k} held: {left:?}");
    }
    let still = b
        .inspect(&keys[1])
        .await?
        .ok_or("the holder's lease is gone")?;
    ensure!(
        still.token == held.token && still.owner == holder,
        "the holder's lease changed: {still:?}"
    );
    b.release(&lease(&keys[1], &holder, held.token)).await?;
    let all = c
        .lock_all(["aon-a", "aon-b", "aon-c"])
        .ttl(long_ttl())
        .acquire()
        .await?;
    all.release().await?;
    Ok(())
}

/// Six clients take overlapping three-key sets out of five keys, ten times
/// each, all at once: every call finishes (a deadlock would end in
/// `Timeout`) and no key is ever held by two of them together.
pub async fn racing_overlapping_sets_never_double_grant(store: &dyn Store) -> TestResult {
    const KEYS: [&str; 5] = ["race-0", "race-1", "race-2", "race-3", "race-4"];
    let sets = (0..6)
        .map(|i| {
            // Sets {i, i+1, i+3} mod 5, listed in a different order by each.
            let mut keys: Vec<&'static str> =
                [i, i + 1, i + 3].iter().map(|n| KEYS[n % 5]).collect();
            keys.rotate_left(i % 3);
            keys
        })
        .collect();
    super::multi::race_key_sets(store, "racer", sets, 10).await
}

/// Each key's token from a multi-key grant is above every token issued for
/// that key before (I2 per key), a later single grant is above it in turn,
/// and a floor on any request is honoured where `min_token` is claimed.
pub async fn tokens_per_key_above_earlier_grants(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let o = owner("atomic-tokens");
    let names = ["mt-a", "mt-b", "mt-c"];
    let mut before = Vec::new();
    for name in names {
        let k = key(name);
        // Two grants per key, so that the keys' counters differ.
        for _ in 0..2 {
            let g = grant(&*b, &k, &o, long_ttl()).await?;
            b.release(&lease(&k, &o, g.token)).await?;
            before.push((name, g.token));
        }
    }
    let c = client(store, "atomic-tokens").await?;
    let all = c.lock_all(names).ttl(long_ttl()).acquire().await?;
    for (name, earlier) in &before {
        let now = all.token(name).ok_or("a key is missing from the guard")?;
        ensure!(
            now > *earlier,
            "{name}: multi-key token {now} is not above the earlier {earlier}"
        );
    }
    let multi = all.tokens();
    all.release().await?;
    for (k, token) in &multi {
        let g = grant(&*b, k, &o, long_ttl()).await?;
        ensure!(
            g.token > *token,
            "{k}: token {} after the multi-key grant {token}",
            g.token
        );
        b.release(&lease(k, &o, g.token)).await?;
    }
    let caps = b.capabilities();
    if caps.atomic_multi && caps.min_token {
        let floor = FencingToken(multi.iter().map(|(_, t)| t.get()).max().unwrap_or(0) + 1_000);
        let requests: Vec<AcquireRequest> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let req = request(&key(name), &o, long_ttl());
                // A floor on the middle key only: the others keep their own.
                req.with_min_token((i == 1).then_some(floor))
            })
            .collect();
        let grants = match b.try_acquire_all(&requests).await? {
            AcquireAll::Granted(grants) => grants,
            held => return Err(format!("free keys not granted: {held:?}").into()),
        };
        ensure!(
            grants[1].token > floor,
            "token {} is not above the floor {floor}",
            grants[1].token
        );
        for (req, g) in requests.iter().zip(&grants) {
            b.release(&req.lease(g.token)).await?;
        }
        let after = grant(&*b, &key(names[1]), &o, long_ttl()).await?;
        ensure!(
            after.token > grants[1].token,
            "token {} after a floored grant {}",
            after.token,
            grants[1].token
        );
    }
    Ok(())
}
