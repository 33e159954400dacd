//! The `timeout` URL option against a Redis that stops answering: connecting
//! and every operation fail transiently within it (the shared check in
//! `fencelock_testkit::timeouts`).

use std::time::Duration;

use fencelock_core::Driver;
use fencelock_testkit::{servers::redis::RedisServer, timeouts, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_operations_fail_within_the_timeout() -> TestResult {
    let redis = RedisServer::start()?;
    timeouts::timeouts_are_honoured(&redis.url(), Duration::from_secs(1), |url| {
        Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await })
    })
    .await
}
