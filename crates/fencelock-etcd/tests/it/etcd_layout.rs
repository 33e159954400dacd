//! `layout=etcd` specifics that the conformance suite does not see: the
//! keys as etcd's clients find them, and a grant renewed by two processes.
//!
//! Time: a real etcd. The grants must outlive the test's requests, so
//! their lease (base [`TTL`], in whole seconds as etcd grants them) is
//! scaled from a [`Patience`] measured against the backend first.

use std::time::Duration;

use etcd_client::{Client, GetOptions};
use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockKey, Owner};
use fencelock_etcd::EtcdLayoutBackend;
use fencelock_testkit::{servers::etcd::EtcdCluster, Patience, TestResult};

const TTL: Duration = Duration::from_secs(10);

/// [`TTL`] scaled by a budget measured against `b`, in whole seconds.
async fn ttl(b: &EtcdLayoutBackend) -> Duration {
    let p = Patience::against(b).await;
    eprintln!("time budget: {p}");
    Duration::from_secs(p.ttl(TTL).as_secs_f64().ceil() as u64)
}

async fn granted(
    b: &EtcdLayoutBackend,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> TestResult<LeaseId> {
    let request = AcquireRequest::new(LockKey::new(key)?, Owner::new(owner)?, ttl);
    match b.try_acquire(&request).await? {
        Acquire::Granted(g) => Ok(request.lease(g.token)),
        held => Err(format!("{key} not granted: {held:?}").into()),
    }
}

#[tokio::test]
async fn a_lock_and_an_election_are_keys_under_their_etcd_name() -> TestResult {
    let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await??;
    let b = EtcdLayoutBackend::connect(&format!("{}?layout=etcd", etcd.url())).await?;
    let mut raw = Client::connect([etcd.url().replace("etcd://", "http://")], None).await?;
    let ttl = ttl(&b).await;
    for (key, name) in [
        ("jobs/nightly", "jobs/nightly/"),
        ("fencelock/election/scheduler", "scheduler/"),
    ] {
        let grant = granted(&b, key, "owner-a", ttl).await?;
        let found = raw.get(name, Some(GetOptions::new().with_prefix())).await?;
        let [kv] = found.kvs() else {
            return Err(format!("{name}: {:?}", found.kvs()).into());
        };
        let id = kv
            .key_str()?
            .strip_prefix(name)
            .ok_or("not under the name")?;
        assert_eq!(
            id,
            format!("{:x}", kv.lease()),
            "the key is named after its lease"
        );
        assert_eq!(u64::try_from(kv.create_revision())?, grant.token.get());
        b.release(&grant).await?;
        assert!(raw
            .get(name, Some(GetOptions::new().with_prefix()))
            .await?
            .kvs()
            .is_empty());
    }
    Ok(())
}

#[tokio::test]
async fn a_grant_renewed_by_another_process_stays_one_grant_for_both() -> TestResult {
    let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await??;
    let url = format!("{}?layout=etcd", etcd.url());
    let (first, second) = (
        EtcdLayoutBackend::connect(&url).await?,
        EtcdLayoutBackend::connect(&url).await?,
    );
    let ttl = ttl(&first).await;
    let grant = granted(&first, "shared/renewal", "owner-a", ttl).await?;
    // The other process moves the key to a lease of its own; the first
    // finds it off its lease and moves it back. The token never changes.
    for b in [&second, &first, &second] {
        let renewed = b.renew(&grant, ttl).await?;
        assert_eq!(renewed.token, grant.token);
    }
    let info = first.inspect(&grant.key).await?.ok_or("not held")?;
    assert_eq!((info.token, info.owner.as_str()), (grant.token, "owner-a"));
    // A stranger with the token, or the owner with another token, is not
    // the grant.
    let stranger = LeaseId::new(grant.key.clone(), Owner::new("owner-b")?, grant.token);
    assert!(first.renew(&stranger, ttl).await.is_err());
    first.release(&grant).await?;
    assert!(second.renew(&grant, ttl).await.is_err());
    assert!(first.inspect(&grant.key).await?.is_none());
    Ok(())
}
