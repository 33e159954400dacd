//! The `timeout` URL option against a Redis that stops answering: connecting
//! and every operation fail transiently within it (the shared check in
//! `fencelock_testkit::timeouts`).
//!
//! Time: a real server behind a real proxy, so no paused clock. The
//! `timeout` (a base of 1 s) is scaled by a [`Patience`] measured against
//! the server first: the operations that must succeed before the cut get
//! it, and the bounds checked after the cut follow it.

use std::time::Duration;

use fencelock_core::Driver;
use fencelock_testkit::{servers::redis::RedisServer, timeouts, Patience, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_operations_fail_within_the_timeout() -> TestResult {
    let redis = RedisServer::start()?;
    let p: Patience = crate::patience(&redis.url()).await?;
    timeouts::timeouts_are_honoured(&redis.url(), p.bound(Duration::from_secs(1)), |url| {
        Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await })
    })
    .await
    .map_err(|e| format!("{e} ({p})").into())
}
