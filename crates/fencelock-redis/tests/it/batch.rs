//! Batched renewal and token floors against a real Redis: a batch is one
//! pipeline answered per lease, with one `WAIT` for the whole batch, and a
//! floor raises the key's counter in the acquire script itself.
//!
//! Time: no verdict here depends on elapsed time. With no replica, every
//! `WAIT` comes back short whatever its 20 ms timeout, and the 30 s leases
//! only have to outlive a few requests: a stall that long is not a busy
//! machine.

use std::time::Duration;

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, FencingToken, Grant, LockKey, Owner, Renewal,
};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, TestResult};

/// How many times the server ran `command` (from `INFO commandstats`).
async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> TestResult<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(Ok(0), str::parse)?)
}

async fn grant(backend: &RedisBackend, request: &AcquireRequest) -> TestResult<Grant> {
    match backend.try_acquire(request).await? {
        Acquire::Granted(g) => Ok(g),
        held => Err(format!("{} not granted: {held:?}", request.key).into()),
    }
}

#[tokio::test]
async fn a_batch_sends_one_wait_and_reports_it_for_every_renewed_lease() -> TestResult {
    let server = RedisServer::start()?;
    let mut admin = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let plain = RedisBackend::connect(&server.url()).await?;
    // No replica exists, so every WAIT comes back short.
    let waiting = RedisBackend::connect(&format!(
        "{}?wait_replicas=1&wait_timeout=20ms",
        server.url()
    ))
    .await?;
    let owner = Owner::new("batch")?;
    let ttl = Duration::from_secs(30);
    let mut renewals = Vec::new();
    for k in ["a", "b", "c"] {
        let request = AcquireRequest::new(LockKey::new(k)?, owner.clone(), ttl);
        let g = grant(&plain, &request).await?;
        renewals.push(Renewal::new(request.lease(g.token), ttl));
    }
    let stale = AcquireRequest::new(LockKey::new("a")?, owner.clone(), ttl)
        .lease(FencingToken(renewals[0].lease.token.get() - 1));
    renewals.push(Renewal::new(stale, ttl));

    let waits = calls(&mut admin, "wait").await?;
    let answers = waiting.renew_many(&renewals).await?;
    assert_eq!(
        calls(&mut admin, "wait").await? - waits,
        1,
        "WAIT was not sent once for the batch"
    );
    assert_eq!(answers.len(), 4);
    for answer in &answers[..3] {
        match answer {
            Err(e) if e.is_transient() && e.to_string().contains("replicas") => {}
            other => return Err(format!("a renewal without its WAIT: {other:?}").into()),
        }
    }
    assert!(matches!(answers[3], Err(Error::NotHeld { .. })));

    let answers = plain.renew_many(&renewals).await?;
    for (answer, renewal) in answers[..3].iter().zip(&renewals) {
        let renewed = answer.as_ref().map_err(|e| format!("{e}"))?;
        assert_eq!(renewed.token, renewal.lease.token);
    }
    Ok(())
}

#[tokio::test]
async fn a_floor_raises_the_counter_in_the_same_script() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(&server.url()).await?;
    let owner = Owner::new("floor")?;
    let request = AcquireRequest::new(LockKey::new("k")?, owner, Duration::from_secs(30));
    // Far above the counter's seed (the server clock in microseconds).
    let floor = FencingToken(1 << 52);
    let floored = grant(&backend, &request.clone().with_min_token(Some(floor))).await?;
    assert_eq!(floored.token, FencingToken(floor.get() + 1));
    backend.release(&request.lease(floored.token)).await?;
    let next = grant(&backend, &request).await?;
    assert_eq!(
        next.token,
        FencingToken(floor.get() + 2),
        "I2 after a floor"
    );
    backend.release(&request.lease(next.token)).await?;

    // Past what the script compares exactly: refused, not rounded.
    let refused = backend
        .try_acquire(&request.clone().with_min_token(Some(FencingToken(1 << 53))))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    Ok(())
}
