//! Semaphores (`docs/semaphore.md`): at most N permits, each a lease that
//! comes back by expiry, fenced per slot key, and a size that never changes
//! silently.

use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{semaphore_slot_key, Error, LockClient, MAX_PERMITS};
use serde_json::json;

use super::{client, ensure, expiry_slack, fence_of, key, long_ttl, short_ttl};
use crate::suite::{Store, TestResult};

/// How long a waiter in these cases may wait before the case calls it stuck.
fn long_wait() -> Duration {
    super::patient(Duration::from_secs(60))
}

/// 16 racers, one try each, on a free semaphore of 3: exactly 3 win, on
/// three different slots. Then 12 workers on 3 connections take and give
/// back permits 5 times each while counting holders: never more than 3.
pub async fn never_more_than_n_holders(store: &dyn Store) -> TestResult {
    const N: u32 = 3;
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(client(store, &format!("sem-racer-{i}")).await?);
    }
    let mut tasks = Vec::new();
    for i in 0..16 {
        let client = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            client
                .semaphore("sem-race", N)
                .ttl(long_ttl())
                .try_acquire()
                .await
        }));
    }
    let mut permits = Vec::new();
    for task in tasks {
        if let Some(permit) = task.await?? {
            permits.push(permit);
        }
    }
    let slots: BTreeSet<u32> = permits.iter().map(|p| p.slot()).collect();
    ensure!(
        permits.len() == N as usize && slots.len() == N as usize,
        "{} racers won, on slots {slots:?}",
        permits.len()
    );
    for permit in permits {
        permit.release().await?;
    }

    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for i in 0..12 {
        let client = clients[i % clients.len()].clone();
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        workers.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = client
                    .semaphore("sem-churn", N)
                    .ttl(long_ttl())
                    .wait(long_wait())
                    .acquire()
                    .await?;
                // Counted only between the grant and the release, so the
                // count never exceeds the leases that exist.
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(
        (1..=N as usize).contains(&most),
        "{most} permits of {N} were held at once"
    );
    Ok(())
}

/// A holder that stops renewing without releasing (a crash) loses its
/// permit at expiry, and a waiter gets it with a higher token.
pub async fn expired_permit_comes_back(store: &dyn Store) -> TestResult {
    let crashed = client(store, "sem-crashed").await?;
    let waiter = client(store, "sem-waiter").await?;
    let permit = crashed
        .semaphore("sem-crash", 1)
        .ttl(short_ttl())
        .acquire()
        .await?;
    let (old_token, granted) = (permit.token(), permit.granted_ttl());
    permit.detach();
    ensure!(
        waiter
            .semaphore("sem-crash", 1)
            .try_acquire()
            .await?
            .is_none(),
        "a second permit of one was granted while the first was live"
    );
    let regained = waiter
        .semaphore("sem-crash", 1)
        .ttl(long_ttl())
        .wait(granted + expiry_slack())
        .acquire()
        .await?;
    ensure!(
        regained.slot() == 0 && regained.token() > old_token,
        "regained slot {} with token {} after token {old_token}",
        regained.slot(),
        regained.token()
    );
    regained.release().await?;
    Ok(())
}

/// Another number of permits for a semaphore with live permits is
/// `PermitsMismatch`, for a bigger and a smaller size, and takes nothing;
/// sizes of 0 or above the limit are invalid arguments.
pub async fn permits_mismatch_is_an_error(store: &dyn Store) -> TestResult {
    let first = client(store, "sem-first").await?;
    let second = client(store, "sem-second").await?;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            first
                .semaphore("sem-size", 2)
                .ttl(long_ttl())
                .acquire()
                .await?,
        );
    }
    for requested in [3, 1] {
        match second
            .semaphore("sem-size", requested)
            .wait(Duration::from_secs(1))
            .acquire()
            .await
        {
            Err(Error::PermitsMismatch {
                name,
                existing,
                requested: asked,
            }) => ensure!(
                name == "sem-size" && existing == 2 && asked == requested,
                "mismatch reported {name} {existing} {asked}"
            ),
            other => return Err(format!("{requested} permits over 2: {other:?}").into()),
        }
    }
    // With one of the two released, slot 0 stays held: still refused.
    let slot1 = held.pop().ok_or("no second permit")?;
    ensure!(
        slot1.slot() == 1,
        "the second permit is on slot {}",
        slot1.slot()
    );
    slot1.release().await?;
    let bigger = second.semaphore("sem-size", 3).try_acquire().await;
    ensure!(
        matches!(bigger, Err(Error::PermitsMismatch { existing: 2, .. })),
        "3 permits over one live permit of 2: {bigger:?}"
    );
    ensure!(
        second.semaphore("sem-size", 2).count().await? == 1,
        "a refused acquisition took a permit"
    );
    for bad in [0, MAX_PERMITS + 1] {
        let r = second.semaphore("sem-bad", bad).try_acquire().await;
        ensure!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{bad} permits gave {r:?}"
        );
    }
    let r = second.semaphore("", 1).try_acquire().await;
    ensure!(
        matches!(r, Err(Error::InvalidKey(_))),
        "empty name gave {r:?}"
    );
    Ok(())
}

/// A permit of another size that the acquisition never meets on the way is
/// found all the same: with a permit of 2 held on slot 1 only (slot 0
/// free), one of 1 (its only slot free) and one of 3 (slot 0 free) are
/// `PermitsMismatch`, tried once or waiting, and take nothing. A semaphore
/// whose name extends this one's is no mismatch, and once the permit of 2
/// is gone a permit of 1 is granted.
pub async fn permits_mismatch_is_found_off_the_path(store: &dyn Store) -> TestResult {
    let first = client(store, "sem-lone-first").await?;
    let second = client(store, "sem-lone-second").await?;
    let other = first
        .semaphore("sem-lone/sub", 3)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let slot0 = first
        .semaphore("sem-lone", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let slot1 = first
        .semaphore("sem-lone", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    ensure!(
        (slot0.slot(), slot1.slot()) == (0, 1),
        "permits of 2 on slots {} and {}",
        slot0.slot(),
        slot1.slot()
    );
    slot0.release().await?;
    for (requested, wait) in [
        (1, Duration::ZERO),
        (1, Duration::from_secs(1)),
        (3, Duration::ZERO),
        (3, Duration::from_secs(1)),
    ] {
        let request = second
            .semaphore("sem-lone", requested)
            .ttl(long_ttl())
            .wait(wait);
        let got = if wait.is_zero() {
            request.try_acquire().await
        } else {
            request.acquire().await.map(Some)
        };
        match got {
            Err(Error::PermitsMismatch {
                name,
                existing,
                requested: asked,
            }) => ensure!(
                name == "sem-lone" && existing == 2 && asked == requested,
                "mismatch reported {name} {existing} {asked}"
            ),
            other => {
                return Err(format!(
                    "{requested} permits (wait {wait:?}) beside a permit of 2 on slot 1: {other:?}"
                )
                .into())
            }
        }
        ensure!(
            second
                .inspect(&semaphore_slot_key("sem-lone", 0))
                .await?
                .is_none(),
            "a refused acquisition of {requested} left slot 0 held"
        );
    }
    let held = second.semaphore("sem-lone", 2).holders().await?;
    ensure!(
        held.len() == 1 && held[0].slot == 1 && held[0].permits == 2,
        "after the refusals the semaphore holds {held:?}"
    );
    slot1.release().await?;
    let mutex = second
        .semaphore("sem-lone", 1)
        .ttl(long_ttl())
        .try_acquire()
        .await?
        .ok_or("a permit of 1 on a free semaphore was refused")?;
    mutex.release().await?;
    other.release().await?;
    Ok(())
}

/// Workers asking for 1 and for 2 permits of one semaphore take and give
/// back permits while counting holders by size: whatever the interleaving,
/// no permit of 1 is held while a permit of 2 is. A worker refused with
/// `PermitsMismatch` asks again at once (up to a bound), so that it keeps
/// racing the other size's releases rather than giving up.
pub async fn sizes_never_hold_together(store: &dyn Store) -> TestResult {
    const GRANTS: usize = 5;
    const ATTEMPTS: usize = 200;
    let mut workers = Vec::new();
    // held[0]: permits of 1 held now; held[1]: permits of 2.
    let held = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    const WORKERS: usize = 8;
    // All start together: on an in-process backend a worker started alone
    // would be done before the next one exists.
    let start = Arc::new(tokio::sync::Barrier::new(WORKERS));
    for i in 0..WORKERS {
        let client = client(store, &format!("sem-sizes-{i}")).await?;
        let size: u32 = if i % 2 == 0 { 1 } else { 2 };
        let (held, overlaps, grants, start) = (
            Arc::clone(&held),
            Arc::clone(&overlaps),
            Arc::clone(&grants),
            Arc::clone(&start),
        );
        workers.push(tokio::spawn(async move {
            let (mine, theirs) = if size == 1 { (0, 1) } else { (1, 0) };
            start.wait().await;
            let mut granted = 0;
            for _ in 0..ATTEMPTS {
                if granted == GRANTS {
                    break;
                }
                let permit = match client
                    .semaphore("sem-sizes", size)
                    .ttl(long_ttl())
                    .wait(long_wait())
                    .acquire()
                    .await
                {
                    Ok(permit) => permit,
                    Err(Error::PermitsMismatch { .. }) => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                granted += 1;
                grants.fetch_add(1, Ordering::SeqCst);
                // Counted only between the grant and the release, so a
                // count of the other size means both were held at once.
                held[mine].fetch_add(1, Ordering::SeqCst);
                if held[theirs].load(Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                // A round trip and a yield while holding, so that the
                // others run meanwhile even on an in-process backend.
                client.inspect(permit.key().as_str()).await?;
                tokio::task::yield_now().await;
                held[mine].fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(
        overlaps == 0,
        "{overlaps} times a permit of 1 and a permit of 2 were held at once"
    );
    ensure!(
        grants.load(Ordering::SeqCst) > 0,
        "no worker was ever granted a permit"
    );
    Ok(())
}

/// With every permit held, a waiter gets `Timeout` (naming the semaphore)
/// after its wait, and `try_acquire` answers `None`.
pub async fn wait_times_out_when_full(store: &dyn Store) -> TestResult {
    let holder = client(store, "sem-holder").await?;
    let waiter = client(store, "sem-waiter").await?;
    let _a = holder
        .semaphore("sem-full", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let _b = holder
        .semaphore("sem-full", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let started = tokio::time::Instant::now();
    let result = waiter
        .semaphore("sem-full", 2)
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    match result {
        Err(Error::Timeout { key, .. }) => {
            ensure!(key.as_str() == "sem-full", "timeout names {key}")
        }
        other => return Err(format!("expected Timeout, got {other:?}").into()),
    }
    ensure!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up before the wait ended"
    );
    ensure!(
        waiter
            .semaphore("sem-full", 2)
            .try_acquire()
            .await?
            .is_none(),
        "try_acquire on a full semaphore returned a permit"
    );
    Ok(())
}

/// A released permit goes to a waiter, on the released slot, with a
/// higher token.
pub async fn release_frees_a_permit_for_a_waiter(store: &dyn Store) -> TestResult {
    let holder = client(store, "sem-holder").await?;
    let waiter = client(store, "sem-waiter").await?;
    let a = holder
        .semaphore("sem-hand", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let b = holder
        .semaphore("sem-hand", 2)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let waiting = tokio::spawn(async move {
        waiter
            .semaphore("sem-hand", 2)
            .ttl(long_ttl())
            .wait(long_wait())
            .acquire()
            .await
    });
    // The permits outlast the wait: the waiter can only get this one.
    let (slot, token) = (b.slot(), b.token());
    b.release().await?;
    let got = waiting.await??;
    ensure!(
        got.slot() == slot && got.token() > token && got.owner().as_str() == "sem-waiter",
        "waiter got slot {} token {} as {}; released slot {slot} token {token}",
        got.slot(),
        got.token(),
        got.owner()
    );
    got.release().await?;
    a.release().await?;
    Ok(())
}

/// `holders` and `count` agree with each other and with `inspect` of the
/// slot keys; the caller's kind and data round-trip; a semaphore whose name
/// extends this one's is not counted.
pub async fn holders_and_count_agree(store: &dyn Store) -> TestResult {
    let c = client(store, "sem-monitor").await?;
    ensure!(
        c.semaphore("sem-mon", 3).count().await? == 0,
        "a fresh semaphore has holders"
    );
    let data = json!({ "job": 7, "tags": ["a", "b"] });
    let p1 = c
        .semaphore("sem-mon", 3)
        .ttl(long_ttl())
        .kind("encoder")
        .data(data.clone())
        .acquire()
        .await?;
    let p2 = c.semaphore("sem-mon", 3).ttl(long_ttl()).acquire().await?;
    let _other = c
        .semaphore("sem-mon/sub", 1)
        .ttl(long_ttl())
        .acquire()
        .await?;
    let holders = c.semaphore("sem-mon", 3).holders().await?;
    ensure!(
        c.semaphore("sem-mon", 3).count().await? == 2 && holders.len() == 2,
        "holders {holders:?}"
    );
    for (holder, permit) in holders.iter().zip([&p1, &p2]) {
        let on_backend = c
            .inspect(&semaphore_slot_key("sem-mon", holder.slot))
            .await?
            .ok_or("a listed permit is not on the backend")?;
        ensure!(
            holder.slot == permit.slot()
                && holder.permits == 3
                && holder.lease.token == permit.token()
                && on_backend.token == permit.token()
                && holder.lease.owner.as_str() == "sem-monitor",
            "holder {holder:?}, permit {permit:?}, backend {on_backend:?}"
        );
    }
    ensure!(
        holders[0].lease.kind.as_deref() == Some("encoder")
            && holders[0].lease.data.as_ref() == Some(&data)
            && holders[1].lease.data.is_none(),
        "kind/data did not round-trip: {holders:?}"
    );
    p2.release().await?;
    ensure!(
        c.semaphore("sem-mon", 3).count().await? == 1,
        "count after a release"
    );
    p1.release().await?;
    Ok(())
}

/// Each permit's token is admitted by the store's fence on the permit's
/// slot key; after a crashed holder's permit is taken over, its token is
/// refused there as stale.
pub async fn permit_tokens_fence_their_slot(store: &dyn Store) -> TestResult {
    let fence = fence_of(store).await?;
    let crashed = client(store, "sem-stale").await?;
    let next: LockClient = client(store, "sem-next").await?;
    let old = crashed
        .semaphore("sem-fence", 1)
        .ttl(short_ttl())
        .acquire()
        .await?;
    let resource = old.key().as_str().to_owned();
    ensure!(
        resource == semaphore_slot_key("sem-fence", 0),
        "permit key {resource}"
    );
    fence.admit(&resource, old.token()).await?;
    let (old_token, granted) = (old.token(), old.granted_ttl());
    old.detach();
    let new = next
        .semaphore("sem-fence", 1)
        .ttl(long_ttl())
        .wait(granted + expiry_slack())
        .acquire()
        .await?;
    ensure!(
        new.key() == &key(&resource),
        "the new permit is on {}",
        new.key()
    );
    fence.admit(&resource, new.token()).await?;
    let stale = fence.admit(&resource, old_token).await;
    ensure!(
        matches!(stale, Err(Error::Stale { .. })),
        "the crashed holder's token was admitted after its successor's: {stale:?}"
    );
    new.release().await?;
    Ok(())
}
