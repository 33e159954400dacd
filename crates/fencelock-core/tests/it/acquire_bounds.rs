//! A waiting acquisition ends near its deadline even when the backend never
//! answers: every call it makes before and while waiting is bounded (paused
//! tokio clock, so the bound is exact).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::fault::{Fault, FaultyBackend};
use fencelock_core::{LockClient, MemoryBackend};
use tokio::time::Instant;

const OP_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn a_hung_backend_costs_at_most_the_wait_plus_one_call() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    faulty.set(Fault::Hang);
    let client = LockClient::builder(faulty)
        .op_timeout(OP_TIMEOUT)
        .build()
        .unwrap();
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(3600),
        client.lock("k").wait(wait).acquire(),
    )
    .await;
    let result = result.expect("the acquisition never ended");
    assert!(result.is_err(), "{result:?}");
    // The subscription for wake-ups gets no more than the wait; the one try
    // that follows, no more than the operation timeout.
    assert!(
        started.elapsed() <= wait + OP_TIMEOUT,
        "ended after {:?}",
        started.elapsed()
    );
}
