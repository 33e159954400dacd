//! `watch` against a real etcd: a grant moved to another lease (a renewal
//! with another TTL) is no holder change, and a key deleted while its lease
//! lives on is a release, not an expiry.
//!
//! Time: a real etcd. The watch is opened before the grant it must
//! report. The grant's leases (30 s, then 60 s: two TTLs, so two leases)
//! must outlive the test and the wait for each change is bounded (10 s):
//! all scaled from a [`Patience`] measured against the backend first; a
//! failure names the budget.

use std::time::Duration;

use etcd_client::Client;
use fencelock_core::{Acquire, AcquireRequest, Backend, HolderChange, LockKey, Owner, Watch};
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{servers::etcd::EtcdCluster, Patience, TestResult};

async fn next(watch: &mut Watch, p: &Patience) -> TestResult<HolderChange> {
    let bound = p.bound(Duration::from_secs(10));
    match tokio::time::timeout(bound, watch.next()).await {
        Ok(Some(change)) => Ok(change?),
        Ok(None) => Err("the watch ended".into()),
        Err(_) => Err(format!("no holder change within {bound:?} [{p}]").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_grant_is_no_change_and_a_deleted_key_is_released() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=watch", etcd.url())).await?;
    let key = LockKey::new("k")?;
    let p = Patience::against(&backend).await;
    let mut changes = backend.watch(&key).await?;
    let request = AcquireRequest::new(
        key.clone(),
        Owner::new("holder")?,
        p.ttl(Duration::from_secs(30)),
    );
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        return Err("k is not free".into());
    };
    let lease = request.lease(grant.token);
    assert!(
        matches!(next(&mut changes, &p).await?, HolderChange::Acquired(i) if i.token == grant.token)
    );
    // A PUT event that moves the key to the shared lease of another TTL.
    backend
        .renew(&lease, p.ttl(Duration::from_secs(60)))
        .await?;
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    raw.delete("watch/locks/k", None).await?;
    assert_eq!(next(&mut changes, &p).await?, HolderChange::Released(lease));
    Ok(())
}
