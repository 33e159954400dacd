//! A waiter's wake-ups (`Backend::subscribe`): a waiter watches the oldest
//! lease node of its key and, on a renewal (a data change), sets its watch
//! again. A node gone by then must wake it: the oldest node left may be the
//! waiter's own queue entry, whose watch never fires for it.
//!
//! Time: a real server, so no paused clock. The wait for the wake-up is a
//! base of 10 s scaled by a patience measured against the server first;
//! the 30 s leases only have to outlive a few requests. The waiter
//! subscribes before the release it waits for.

use std::{sync::Arc, time::Duration};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};
use fencelock_testkit::{servers::zookeeper::ZkServer, TestResult};
use fencelock_zookeeper::{ZkBackend, DEFAULT_PREFIX};
use tokio::time::timeout;
use zookeeper_client as zk;

/// Bound on waiting for what must happen, as a base figure; never a
/// timing assertion.
const BOUND: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(30);

/// A release is a touch and then a delete; here both land in one
/// transaction, so the watch set again after the touch's event always
/// finds the holder's node gone. Before, the waiter then watched its own
/// entry and was woken by nothing: it took its turn only on a try of its
/// own, up to a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_renewed_and_deleted_at_once_wakes_the_waiter_behind_it() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    let bound = p.bound(BOUND);
    let holder: Arc<dyn Backend> = Arc::new(ZkBackend::connect(&zk.url()).await?);
    let waiter: Arc<dyn Backend> = Arc::new(ZkBackend::connect(&zk.url()).await?);
    let look = zk::Client::connect(zk.url().trim_start_matches("zk://")).await?;
    let key = LockKey::new("woken")?;

    let held = AcquireRequest::new(key.clone(), Owner::new("holder")?, TTL);
    let Acquire::Granted(_) = holder.try_acquire(&held).await? else {
        return Err("the holder was not granted a free key".into());
    };
    let queued = AcquireRequest::new(key.clone(), Owner::new("waiter")?, TTL).with_queue(true);
    let Acquire::Held(_) = waiter.try_acquire(&queued).await? else {
        return Err("the waiter was granted a held key".into());
    };
    let mut wakeups = waiter.subscribe(&key).await?.ok_or("no wake-ups")?;

    // The key's one directory, and the holder's node: the oldest in it.
    let locks = format!("/{DEFAULT_PREFIX}/locks");
    let dirs = look.list_children(&locks).await?;
    let [dir] = dirs.as_slice() else {
        return Err(format!("keys under {locks}: {dirs:?}").into());
    };
    let dir = format!("{locks}/{dir}");
    let mut nodes = look.list_children(&dir).await?;
    nodes.retain(|n| n.starts_with("l-"));
    nodes.sort();
    let [first, _entry] = nodes.as_slice() else {
        return Err(format!("nodes of the key: {nodes:?}").into());
    };
    let first = format!("{dir}/{first}");
    let (data, _) = look.get_data(&first).await?;

    let mut release = look.new_multi_writer();
    release.add_set_data(&first, &data, None)?;
    release.add_delete(&first, None)?;
    release.commit().await?;

    match timeout(bound, wakeups.woken()).await {
        Ok(true) => {}
        Ok(false) => return Err("the wake-ups ended".into()),
        Err(_) => return Err(format!("the waiter was not woken within {bound:?} ({p})").into()),
    }
    let Acquire::Granted(_) = waiter.try_acquire(&queued).await? else {
        return Err("woken, the waiter was not granted the key".into());
    };
    Ok(())
}
