//! The store's change feed (`Backend::changes`) names a key whose holder a
//! fair waiter's turn changed. That turn writes nothing (`src/queue.rs`):
//! the waiter's queue entry holds the key from the moment the node ahead
//! of it is deleted, so the deletion's notice is the grant's, and a
//! follower that reads the key at that notice finds the waiter holding it,
//! not the key free.
//!
//! Time: a real server (restarted in one test), so no paused clock. Every
//! wait for what must happen (the waiter's queueing and grant, a notice,
//! the restart's missed notices) is a base figure scaled by a patience
//! measured against the server first; failures name it. The 500 ms each
//! change after the restart is given to come through is no verdict: the
//! loop tries again until its own scaled deadline. The 30 s leases only
//! have to outlive a few requests. The feed is opened before every change
//! it must report.

use std::{sync::Arc, time::Duration};

use fencelock_core::{Backend, Change, ChangeFeed, FairQueue, LockClient, LockKey};
use fencelock_testkit::{servers::zookeeper::ZkServer, TestResult};
use fencelock_zookeeper::ZkBackend;
use tokio::time::{timeout, Instant};

/// Bound on waiting for what must happen, as a base figure; never a
/// timing assertion.
const BOUND: Duration = Duration::from_secs(10);

/// Reads `feed` until it names `key`; false if it does not within `bound`.
async fn named(feed: &mut ChangeFeed, key: &str, bound: Duration) -> bool {
    let end = Instant::now() + bound;
    loop {
        match timeout(end.saturating_duration_since(Instant::now()), feed.next()).await {
            Ok(Some(Change::Key(k))) if k == key => return true,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiters_turn_is_named_by_the_release_before_it() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    let bound = p.bound(BOUND);
    let watched = ZkBackend::connect(&zk.url()).await?;
    let mut feed = watched.changes().await?.ok_or("no change feed")?;
    let holder_side = Arc::new(ZkBackend::connect(&zk.url()).await?);
    let holder = LockClient::new(holder_side.clone());
    let waiter = LockClient::new(Arc::new(ZkBackend::connect(&zk.url()).await?));
    let key = LockKey::new("fair")?;

    let held = holder
        .lock("fair")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let waiting = tokio::spawn(async move {
        waiter
            .lock("fair")
            .ttl(Duration::from_secs(30))
            .wait(bound)
            .acquire()
            .await
    });
    let queued_by = Instant::now() + bound;
    let entry = loop {
        if let Some(entry) = holder_side.queue(&key).await?.into_iter().next() {
            break entry;
        }
        if Instant::now() > queued_by {
            return Err(format!("the waiter never queued ({p})").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    while feed.try_next().is_some() {}

    held.release().await?;
    assert!(
        named(&mut feed, "fair", bound).await,
        "the release was not named within {bound:?} ({p})"
    );
    // Read at the notice, whether or not the waiter has woken yet.
    let now = watched.inspect(&key).await?.ok_or("the key reads free")?;
    assert_eq!(
        (&now.owner, now.token),
        (&entry.owner, entry.token),
        "the key's holder after the release is not the queue's head"
    );
    assert!(
        holder_side.queue(&key).await?.is_empty(),
        "the entry that holds the key is still listed as waiting"
    );
    let granted = waiting
        .await?
        .map_err(|e| format!("the waiter's turn: {e} ({p})"))?;
    assert_eq!(granted.token(), entry.token, "granted another token");
    granted.release().await?;
    Ok(())
}

/// The watch behind the feed does not outlive a server restart on its own:
/// the feed reports that notices were missed (its reader lists the store
/// once), and the watch, added again, names later changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_comes_back_after_a_server_restart() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    let watched = ZkBackend::connect(&zk.url()).await?;
    let mut feed = watched.changes().await?.ok_or("no change feed")?;

    zk.kill(0)?;
    zk.start_again(0)?;
    let missed_by = Instant::now() + p.bound(BOUND * 3);
    loop {
        match timeout(
            missed_by.saturating_duration_since(Instant::now()),
            feed.next(),
        )
        .await
        {
            Ok(Some(Change::Missed)) => break,
            Ok(Some(_)) => {}
            Ok(None) => return Err("the feed ended".into()),
            Err(_) => {
                return Err(format!("the restart was not reported as missed notices ({p})").into())
            }
        }
    }

    // The watch is only known to be back once a change comes through it:
    // keep changing the key (each grant is a node created) until one does.
    let client = LockClient::new(Arc::new(ZkBackend::connect(&zk.url()).await?));
    let named_by = Instant::now() + p.bound(BOUND * 3);
    loop {
        client
            .lock("after")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await?
            .release()
            .await?;
        if named(&mut feed, "after", Duration::from_millis(500)).await {
            return Ok(());
        }
        if Instant::now() > named_by {
            return Err(format!("no change was named after the restart ({p})").into());
        }
    }
}
