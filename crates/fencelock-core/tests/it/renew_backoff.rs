//! A renewal that keeps failing at once (a lock service that is down
//! refuses connections in microseconds) is retried with backoff, so a
//! lease costs a bounded number of requests before it is declared lost,
//! never a burst (paused tokio clock, so the count is exact).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    fault::{Fault, FaultyBackend},
    LockClient, LossReason, MemoryBackend,
};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn failing_renewals_back_off_until_the_lease_is_lost() {
    let faulty = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let client = LockClient::new(faulty.clone());
    let ttl = Duration::from_secs(3);
    let guard = client.lock("job").ttl(ttl).acquire().await.unwrap();
    faulty.set(Fault::RefuseRenewals);
    let started = Instant::now();
    let reason = guard.lost().await;
    assert_eq!(reason, LossReason::Deadline);
    // The first renewal goes at most a tenth early (at ≥ 0.9·ttl/3 = 0.9 s)
    // and the deadline comes before ttl = 3 s, which leaves < 2.1 s for
    // retries paced at least half of ttl/100, 2·ttl/100, 4·ttl/100,
    // 8·ttl/100 (0.225 s in all), then half of ttl/10 (0.15 s) each: at
    // most 1 + 4 + 12 = 17 attempts, whatever the draws. With full jitter
    // any number could go out within a millisecond.
    let calls = faulty.renew_calls();
    assert!(
        (2..=17).contains(&calls),
        "{calls} renewal attempts in {:?} for one {ttl:?} lease",
        started.elapsed()
    );
}
