//! The `timeout` URL option against a ZooKeeper that stops answering:
//! connecting and every operation fail transiently within it (the shared
//! check in `fencelock_testkit::timeouts`).
//!
//! Time: a real server behind a real proxy, so no paused clock. The
//! `timeout` (a base of 1 s) is scaled by a patience measured against the
//! server first: the operations that must succeed before the cut get it,
//! and the bounds checked after the cut follow it.

use std::time::Duration;

use fencelock_core::Driver;
use fencelock_testkit::{servers::zookeeper::ZkServer, timeouts, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_operations_fail_within_the_timeout() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    timeouts::timeouts_are_honoured(&zk.url(), p.bound(Duration::from_secs(1)), |url| {
        Box::pin(async move { fencelock_zookeeper::ZkDriver.open_backend(&url).await })
    })
    .await
    .map_err(|e| format!("{e} ({p})").into())
}
