//! Release notices reach only backends that wait for that key: each key has
//! its own channel, subscribed while a waiter exists and unsubscribed after,
//! so a process that does not wait is never woken by other processes'
//! releases.
//!
//! Time: a real server, so no paused clock. The waits for the wake-up and
//! for the background `UNSUBSCRIBE` are bases of 10 s scaled by a
//! [`Patience`] measured against the server at the start.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockKey, Owner};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, Patience, TestResult};

/// Subscribers of the release channel of user key `k`, as the server counts
/// them (default prefix `fencelock`).
async fn listeners(conn: &mut redis::aio::MultiplexedConnection, k: &str) -> TestResult<i64> {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("fencelock:{{{k}}}:released"))
        .query_async(conn)
        .await?;
    Ok(n)
}

#[tokio::test]
async fn a_key_channel_is_subscribed_only_while_someone_waits_for_it() -> TestResult {
    let server = RedisServer::start()?;
    let mut admin = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let holder = RedisBackend::connect(&server.url()).await?;
    let waiter = RedisBackend::connect(&server.url()).await?;
    let p = Patience::against(&holder).await;
    let key = LockKey::new("job")?;
    let owner = Owner::new("holder")?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
    let Acquire::Granted(grant) = holder.try_acquire(&request).await? else {
        return Err("free key not granted".into());
    };
    assert_eq!(listeners(&mut admin, "job").await?, 0, "nobody waits yet");

    let mut subscription = waiter
        .subscribe(&key)
        .await?
        .ok_or("redis offers wake-ups")?;
    // Live on the server when subscribe returns: a release now is not missed.
    assert_eq!(listeners(&mut admin, "job").await?, 1);
    assert_eq!(
        listeners(&mut admin, "other").await?,
        0,
        "only the waited key"
    );
    holder
        .release(&LeaseId::new(key.clone(), owner.clone(), grant.token))
        .await?;
    let woken = tokio::time::timeout(p.bound(Duration::from_secs(10)), subscription.woken()).await;
    assert_eq!(woken.ok(), Some(true), "the waiter was not woken ({p})");

    drop(subscription);
    // The UNSUBSCRIBE is sent in the background after the last waiter left.
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(10));
    while listeners(&mut admin, "job").await? != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still subscribed with no waiter left ({p})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
