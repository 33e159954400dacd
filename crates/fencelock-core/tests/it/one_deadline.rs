//! Semaphores and multi-key locks wait under ONE deadline for the whole
//! call, however many slots or keys they try (paused tokio clock, so the
//! instants are exact).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{Error, LockClient, MemoryBackend, Owner};
use tokio::time::Instant;

/// Up to this much past the deadline: the last try, which on the paused
/// clock takes no time at all.
const SLACK: Duration = Duration::from_millis(1);

fn clients() -> (LockClient, LockClient) {
    let memory = Arc::new(MemoryBackend::new());
    let holder = LockClient::builder(memory.clone())
        .owner(Owner::new("holder").unwrap())
        .build()
        .unwrap();
    let waiter = LockClient::builder(memory)
        .owner(Owner::new("waiter").unwrap())
        .build()
        .unwrap();
    (holder, waiter)
}

#[tokio::test(start_paused = true)]
async fn a_full_semaphore_times_out_at_the_deadline() {
    let (holder, waiter) = clients();
    let _a = holder
        .semaphore("s", 2)
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let _b = holder
        .semaphore("s", 2)
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let result = waiter.semaphore("s", 2).wait(wait).acquire().await;
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    let took = started.elapsed();
    assert!(took >= wait && took <= wait + SLACK, "took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_permit_that_expires_is_taken_when_it_ends() {
    let (holder, waiter) = clients();
    let ttl = Duration::from_secs(3);
    let crashed = holder.semaphore("s", 1).ttl(ttl).acquire().await.unwrap();
    let old = crashed.token();
    crashed.detach();
    let started = Instant::now();
    let permit = waiter
        .semaphore("s", 1)
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    assert!(permit.token() > old);
    // The waiter slept until the holder's expiry (which the refusal
    // carried), not a backoff step later.
    let took = started.elapsed();
    assert!(
        took >= ttl - SLACK && took <= ttl + Duration::from_millis(2),
        "took {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lock_all_shares_one_deadline_between_its_keys() {
    let (holder, waiter) = clients();
    // `b` frees itself after 3 s; `d` stays held. A wait per key would
    // give up on `d` 5 s after getting `b`; one deadline ends at 5 s.
    let b = holder
        .lock("b")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    b.detach();
    let _d = holder
        .lock("d")
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let result = waiter.lock_all(["d", "a", "b"]).wait(wait).acquire().await;
    match result {
        Err(Error::Timeout { key, waited }) => {
            assert_eq!(key.as_str(), "d");
            assert_eq!(waited, wait);
        }
        other => panic!("{other:?}"),
    }
    let took = started.elapsed();
    assert!(took >= wait && took <= wait + SLACK, "took {took:?}");
    // All or nothing: the parts taken before `d` were given back.
    assert!(waiter.inspect("a").await.unwrap().is_none());
    assert!(waiter.inspect("b").await.unwrap().is_none());
}
