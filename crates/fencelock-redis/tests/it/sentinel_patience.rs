//! What a Sentinel failover costs the clients that are patient: nothing.
//! A master, a replica and three Sentinels (down-after 1 s) on loopback;
//! the master is killed with SIGKILL.
//!
//! - Holders whose lease is three times the failover (a base of 8 s; the
//!   Sentinels name the new master 2–3 s after the kill) keep every lock:
//!   the client follows the failover as soon as the Sentinels name the new
//!   master, and the renewal retried there finds the lease the replica
//!   received.
//! - A client opened at the moment of the kill, while the Sentinels still
//!   name the dead master, waits for the failover instead of failing, and
//!   its acquisition with a wait (a base of 20 s) is granted.
//!
//! Time: real servers and Sentinels killed for real, so no paused clock.
//! A patience (`fencelock_testkit::Patience`) measured against the set
//! first scales the TTL and every wait; failures name it. The kill still
//! lands [`KILL_AHEAD`] (unscaled) before the first renewal is due, so
//! that the renewal meets the dead master: the Sentinels take as long to
//! name another (down-after 1 s, then an election) whatever the TTL.

use std::{sync::Arc, time::Duration};

use fencelock_core::{Backend, LockClient, LockGuard, Owner};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis_sentinel::RedisSentinel, TestResult};

/// The holders' TTL, as a base figure.
const TTL: Duration = Duration::from_secs(8);
/// How long before the first renewal is due the master is killed: less
/// than the Sentinels take to name another (down-after 1 s, then an
/// election).
const KILL_AHEAD: Duration = Duration::from_millis(1333);
const HOLDERS: usize = 6;

async fn start() -> TestResult<Arc<RedisSentinel>> {
    Ok(Arc::new(
        tokio::task::spawn_blocking(RedisSentinel::start).await??,
    ))
}

fn client(backend: RedisBackend, owner: &str) -> TestResult<LockClient> {
    Ok(LockClient::builder(Arc::new(backend) as Arc<dyn Backend>)
        .owner(Owner::new(owner)?)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_keep_their_locks_through_a_killed_master() -> TestResult {
    let set = start().await?;
    let url = format!("{}?prefix=patience", set.url());
    let p = crate::patience(&url).await?;
    let ttl = p.ttl(TTL);
    let holders = client(RedisBackend::connect(&url).await?, "holder")?;
    let mut guards: Vec<LockGuard> = Vec::new();
    let granted = tokio::time::Instant::now();
    for i in 0..HOLDERS {
        guards.push(holders.lock(format!("held:{i}")).ttl(ttl).acquire().await?);
    }
    // Replication is asynchronous: a lease the replica has not received
    // when the master dies is lost with it, whatever the client does
    // (`wait_replicas=N` makes grants wait for replicas, docs/redis.md).
    // Only losses the client could have avoided are counted here.
    let s = Arc::clone(&set);
    tokio::task::spawn_blocking(move || s.wait_replicated()).await??;
    // The kill lands shortly before the next renewal (due a third of the
    // lease after the grant; half-way to it at the base TTL), so that the
    // renewal meets the dead master before the Sentinels have named
    // another.
    tokio::time::sleep_until(granted + ttl / 3 - KILL_AHEAD).await;
    let killed = tokio::time::Instant::now();
    let s = Arc::clone(&set);
    let (old, new) = tokio::task::spawn_blocking(move || s.kill_master()).await??;
    eprintln!(
        "the Sentinels named {new} in place of {old} {:?} after the kill",
        killed.elapsed()
    );
    // Every lease must be renewed on the new master: a renewal sent after
    // the kill has succeeded once its lease ends later than any lease
    // granted before the kill could.
    let renewed_after = chrono::Utc::now() + ttl;
    for guard in &guards {
        let renewed = tokio::time::timeout(ttl * 2, async {
            loop {
                if guard.expires_at() > renewed_after {
                    return Ok(());
                }
                tokio::select! {
                    reason = guard.lost() => return Err(reason),
                    () = tokio::time::sleep(ttl / 20) => {}
                }
            }
        })
        .await;
        match renewed {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                return Err(format!("{} was lost: {reason:?} ({p})", guard.key()).into())
            }
            Err(_) => return Err(format!("{} was not renewed ({p})", guard.key()).into()),
        }
    }
    let direct = RedisBackend::connect(&url).await?;
    for guard in &guards {
        let held = direct
            .inspect(guard.key())
            .await?
            .ok_or_else(|| format!("the new master has no lease for {}", guard.key()))?;
        assert_eq!(
            (&held.owner, held.token),
            (guard.owner(), guard.token()),
            "{}",
            guard.key()
        );
    }
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_opened_at_the_kill_waits_for_the_new_master() -> TestResult {
    let set = start().await?;
    let url = format!("{}?prefix=patience", set.url());
    let p = crate::patience(&url).await?;
    let old = set.master_port()?;
    set.kill(old)?;
    // Opening asks the Sentinels, which still name the dead master for
    // about a second: the client asks again until they name one that
    // answers.
    let waiter = client(RedisBackend::connect(&url).await?, "waiter")?;
    let guard = waiter
        .lock("after-the-kill")
        .ttl(p.ttl(TTL))
        .wait(p.bound(Duration::from_secs(20)))
        .acquire()
        .await
        .map_err(|e| format!("acquiring through the failover: {e} ({p})"))?;
    assert_ne!(
        set.master_port()?,
        old,
        "granted by a master that was killed"
    );
    guard.release().await?;
    Ok(())
}
