//! Restart-safe tokens: `kill -9` a Redis without persistence, start it again
//! on the same port, and the next grant's token is above every token issued
//! before the crash (the counter is re-seeded from the server's TIME).
//!
//! Time: a real server killed and started again, so no paused clock. The
//! only bound, how long the grants after the restart may take to come
//! back, is a base of 30 s scaled by a [`Patience`] measured against the
//! server at the start. The leases' 60 s TTL takes no part: the crash
//! loses them, and each grant before it is released at once.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, FencingToken, LeaseId, LockKey, Owner};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, Patience, TestResult};

fn request(key: &LockKey, owner: &Owner) -> AcquireRequest {
    AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(60))
}

/// Retries through the reconnect after the restart.
async fn grant_after_restart(
    b: &RedisBackend,
    key: &LockKey,
    owner: &Owner,
    p: Patience,
) -> TestResult<FencingToken> {
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(30));
    loop {
        let last = match b.try_acquire(&request(key, owner)).await {
            Ok(Acquire::Granted(g)) => return Ok(g.token),
            Ok(held) => format!("{held:?}"),
            Err(e) if e.is_transient() => e.to_string(),
            Err(e) => return Err(e.into()),
        };
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no grant on {key} after the restart: {last} ({p})").into());
        }
        // Bounded retry while the connection manager reconnects.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_kill_9_without_persistence() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(&server.url()).await?;
    let p = Patience::against(&backend).await;
    let owner = Owner::new("before-crash")?;
    let keys: Vec<LockKey> = (0..5)
        .map(|i| LockKey::new(format!("restart-{i}")))
        .collect::<Result<_, _>>()?;
    let mut highest = FencingToken(0);
    // Many grants per key, so the counters run ahead of their seeds; the
    // last key stays held across the crash.
    for (i, key) in keys.iter().enumerate() {
        for round in 0..50 {
            let Acquire::Granted(g) = backend.try_acquire(&request(key, &owner)).await? else {
                return Err(format!("{key} was not free").into());
            };
            highest = highest.max(g.token);
            let keep = i == keys.len() - 1 && round == 49;
            if !keep {
                backend
                    .release(&LeaseId::new(key.clone(), owner.clone(), g.token))
                    .await?;
            }
        }
    }
    server.kill(0)?;
    server.start_again(0)?;
    let after = Owner::new("after-crash")?;
    for key in &keys {
        let token = grant_after_restart(&backend, key, &after, p).await?;
        assert!(
            token > highest,
            "{key}: token {token} after the crash is not above {highest}"
        );
    }
    Ok(())
}
