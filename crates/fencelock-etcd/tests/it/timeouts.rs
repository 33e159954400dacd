//! The `timeout` URL option against an etcd that stops answering: connecting
//! and every operation fail transiently within it (the shared check in
//! `fencelock_testkit::timeouts`).
//!
//! Time: the 1 s is the figure under test; the shared check allows beyond
//! it a slack scaled from a budget it measures (`timeouts::slack`).

use std::time::Duration;

use fencelock_core::Driver;
use fencelock_testkit::{servers::etcd::EtcdCluster, timeouts, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_operations_fail_within_the_timeout() -> TestResult {
    let etcd = EtcdCluster::start()?;
    timeouts::timeouts_are_honoured(&etcd.url(), Duration::from_secs(1), |url| {
        Box::pin(async move { fencelock_etcd::EtcdDriver.open_backend(&url).await })
    })
    .await
}
