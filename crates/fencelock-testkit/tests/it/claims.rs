//! The capability cases catch a false claim: a backend that claims
//! `set_data` without implementing it fails
//! `capabilities::set_data_replaces_the_holders_data_or_is_refused`, and the
//! same backend without the claim passes it (refused as `Unsupported`);
//! likewise `atomic_multi` and `atomic::claim_holds`, and `fair` (a racing
//! lock with no queue) and the `fair::*` cases.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Grant, LeaseId, LockInfo, LockKey,
    MemoryBackend, Result,
};
use fencelock_testkit::{async_trait, cases::CASES, Store, TestResult};

/// The memory backend with `set_data` and `try_acquire_all` left to the
/// trait's defaults, and claimed or not.
#[derive(Debug)]
struct Claims {
    inner: MemoryBackend,
    caps: Capabilities,
}

#[async_trait]
impl Backend for Claims {
    fn name(&self) -> &'static str {
        "claims"
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.inner.try_acquire(request).await
    }
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }
}

struct ClaimsStore {
    inner: MemoryBackend,
    caps: Capabilities,
}

#[async_trait]
impl Store for ClaimsStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(Claims {
            inner: self.inner.clone(),
            caps: self.caps,
        }))
    }
}

async fn run_case(name: &str, caps: Capabilities) -> TestResult {
    let case = CASES.iter().find(|c| c.name == name).unwrap();
    let store = ClaimsStore {
        inner: MemoryBackend::new(),
        caps,
    };
    (case.run)(&store).await
}

async fn set_data_case(set_data: bool) -> TestResult {
    run_case(
        "capabilities::set_data_replaces_the_holders_data_or_is_refused",
        Capabilities::default().with_set_data(set_data),
    )
    .await
}

#[tokio::test]
async fn a_false_atomic_multi_claim_fails_the_case() {
    let caps = Capabilities::default().with_atomic_multi(true);
    let verdict = run_case("atomic::claim_holds", caps).await;
    assert!(verdict.is_err(), "a false claim passed");
}

#[tokio::test]
async fn no_atomic_multi_claim_passes_and_lock_all_goes_one_by_one() {
    for name in [
        "atomic::claim_holds",
        "atomic::all_or_nothing_under_contention",
        "atomic::tokens_per_key_above_earlier_grants",
    ] {
        run_case(name, Capabilities::default()).await.unwrap();
    }
}

#[tokio::test]
async fn a_false_set_data_claim_fails_the_case() {
    let verdict = set_data_case(true).await;
    assert!(verdict.is_err(), "a false claim passed");
}

#[tokio::test]
async fn no_claim_passes_the_case_as_unsupported() {
    set_data_case(false).await.unwrap();
}

#[tokio::test]
async fn a_false_fair_claim_fails_the_order_case() {
    let caps = Capabilities::default().with_wakeups(true).with_fair(true);
    let verdict = run_case("fair::waiters_are_granted_in_arrival_order", caps).await;
    assert!(verdict.is_err(), "a false claim passed");
}

#[tokio::test]
async fn no_fair_claim_passes_every_fair_case() {
    for case in CASES.iter().filter(|c| c.name.starts_with("fair::")) {
        run_case(case.name, Capabilities::default()).await.unwrap();
    }
}
