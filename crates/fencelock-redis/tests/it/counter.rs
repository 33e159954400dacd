//! Token counters of idle keys expire, and a re-seeded counter continues
//! above every token issued before.
//!
//! Time: no verdict here depends on elapsed time: the week-long expiry is
//! read from the server (`PTTL`) and its end is simulated by deleting the
//! counter; each 30 s lease is released at once.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockKey, LockMode, Owner};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, TestResult};

async fn grant(backend: &RedisBackend, key: &LockKey) -> TestResult<u64> {
    let request = AcquireRequest::new(key.clone(), Owner::new("o")?, Duration::from_secs(30));
    match backend.try_acquire(&request).await? {
        Acquire::Granted(g) => {
            backend
                .release(&LeaseId::new(key.clone(), request.owner.clone(), g.token))
                .await?;
            Ok(g.token.get())
        }
        held => Err(format!("not granted: {held:?}").into()),
    }
}

#[tokio::test]
async fn an_idle_counter_expires_and_reseeds_above_its_tokens() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(&server.url()).await?;
    let key = LockKey::new("order:1")?;
    let before = grant(&backend, &key).await?;
    let mut raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let counter = "fencelock:{order:1}:token";
    let pttl: i64 = redis::cmd("PTTL")
        .arg(counter)
        .query_async(&mut raw)
        .await?;
    assert!(
        pttl > 6 * 24 * 3600 * 1000,
        "the counter has no week-long expiry: {pttl}"
    );
    // As if the week had passed.
    let _: () = redis::cmd("DEL").arg(counter).query_async(&mut raw).await?;
    let after = grant(&backend, &key).await?;
    assert!(after > before, "{after} <= {before}");
    Ok(())
}

#[tokio::test]
async fn a_counter_restored_from_an_old_snapshot_does_not_reissue_tokens() -> TestResult {
    // What a restart from an RDB snapshot taken before the last grants, or a
    // promoted replica that had not caught up, leaves behind.
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(&server.url()).await?;
    let key = LockKey::new("order:2")?;
    let mut raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let counter = "fencelock:{order:2}:token";
    let first = grant(&backend, &key).await?;
    let snapshot: String = redis::cmd("GET").arg(counter).query_async(&mut raw).await?;
    let mut issued = vec![first];
    for _ in 0..3 {
        issued.push(grant(&backend, &key).await?);
    }
    let _: () = redis::cmd("SET")
        .arg(counter)
        .arg(&snapshot)
        .query_async(&mut raw)
        .await?;
    let after = grant(&backend, &key).await?;
    let highest = issued.iter().copied().max().unwrap_or(0);
    assert!(
        after > highest,
        "token {after} reissued (issued before: {issued:?})"
    );
    Ok(())
}

/// At 2^53 − 1 (`FencingToken::MAX`) a key's counter ends with a typed
/// error on that key: no token is drawn past it (Lua would round it into a
/// repeat), the key's last lease is untouched and other keys go on.
#[tokio::test]
async fn a_counter_at_the_last_token_ends_with_a_typed_error() -> TestResult {
    use fencelock_core::{Error, FencingToken};
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(&server.url()).await?;
    let mut raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let key = LockKey::new("order:2")?;
    let _: () = redis::cmd("SET")
        .arg("fencelock:{order:2}:token")
        .arg(FencingToken::MAX.get() - 1)
        .query_async(&mut raw)
        .await?;
    assert_eq!(grant(&backend, &key).await?, FencingToken::MAX.get());
    let request = AcquireRequest::new(key.clone(), Owner::new("o")?, Duration::from_secs(30));
    for spent in [
        backend.try_acquire(&request).await,
        backend
            .try_acquire(&request.clone().with_mode(LockMode::Shared))
            .await,
    ] {
        assert!(
            matches!(&spent, Err(Error::TokensExhausted { key: k }) if *k == key),
            "{spent:?}"
        );
    }
    let counter: String = redis::cmd("GET")
        .arg("fencelock:{order:2}:token")
        .query_async(&mut raw)
        .await?;
    assert_eq!(counter, FencingToken::MAX.get().to_string());
    let other = grant(&backend, &LockKey::new("order:3")?).await?;
    assert!(other < FencingToken::MAX.get());
    Ok(())
}
