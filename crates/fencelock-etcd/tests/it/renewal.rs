//! Renewal against a real etcd: a renewal must prove that the key still
//! carries this grant (not only that its lease is alive), a renewal with
//! another TTL moves the grant to a lease of that TTL without changing its
//! token, and grants of one TTL share one lease without sharing their fate
//! when one of them is deleted, moved or released.
//!
//! Time: a real etcd. Each test measures a [`Patience`] against its
//! backend first and takes every lease that must outlive its requests from
//! it ([`ttl`]: the base scaled, in whole seconds as etcd grants them), the
//! TTLs it compares included (they stay distinct, and the checks compare
//! with the scaled figures), and the bound on a loss (two leases); a
//! failure names the budget. The smallest TTL (1 ms, etcd's own minimum
//! granted) is the figure under test and keeps it.

use std::{sync::Arc, time::Duration};

use etcd_client::{Client, PutOptions};
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, FencingToken, Grant, LeaseId, LockClient, LockKey,
    LossReason, Owner, Renewal,
};
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{servers::etcd::EtcdCluster, Patience, TestResult};

/// A budget measured against `backend`, shown with any failure.
async fn measured(backend: &dyn Backend) -> Patience {
    let p = Patience::against(backend).await;
    eprintln!("time budget: {p}");
    p
}

/// `base_secs` scaled by `p`, rounded up to whole seconds.
fn ttl(p: &Patience, base_secs: u64) -> Duration {
    let scaled = p.ttl(Duration::from_secs(base_secs));
    Duration::from_secs(scaled.as_secs() + u64::from(scaled.subsec_nanos() > 0))
}

/// `d` in etcd's whole seconds.
fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The raw etcd key of lock `key` under `prefix`.
fn raw_key(prefix: &str, key: &str) -> String {
    format!("{prefix}/locks/{key}")
}

/// The key's (create revision, lease id), or `None` when it does not exist.
async fn key_state(raw: &mut Client, key: &str) -> TestResult<Option<(i64, i64)>> {
    let resp = raw.get(key, None).await?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.lease())))
}

/// The lease's (granted TTL, remaining TTL) in seconds; remaining is -1
/// once the lease is gone.
async fn lease_ttls(raw: &mut Client, lease: i64) -> TestResult<(i64, i64)> {
    let resp = raw.lease_time_to_live(lease, None).await?;
    Ok((resp.granted_ttl(), resp.ttl()))
}

async fn acquire(
    backend: &EtcdBackend,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
) -> TestResult<Grant> {
    let request = AcquireRequest::new(key.clone(), owner.clone(), ttl);
    match backend.try_acquire(&request).await? {
        Acquire::Granted(g) => Ok(g),
        Acquire::Held(h) => Err(format!("{key} is held: {h:?}").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_key_is_a_refused_renewal_and_frees_the_lock() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let url = format!("{}?prefix=deleted", etcd.url());
    let backend: Arc<dyn Backend> = Arc::new(EtcdBackend::connect(&url).await?);
    let p = measured(&*backend).await;
    let holder = LockClient::builder(Arc::clone(&backend))
        .owner(Owner::new("holder")?)
        .build()?;
    // Renewed every third of the lease; trusted for ~0.9 of it after each
    // renewal.
    let lease = ttl(&p, 3);
    let guard = holder.lock("k").ttl(lease).acquire().await?;

    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    let deleted = raw.delete(raw_key("deleted", "k"), None).await?;
    assert_eq!(deleted.deleted(), 1, "the lock key was not there to delete");

    // Without a check of the key, every keep-alive succeeds and the guard
    // never learns of the deletion: `lost()` would never complete.
    let bound = lease * 2;
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| {
            format!("the guard still believes it holds a deleted key after {bound:?} [{p}]")
        })?;
    assert_eq!(reason, LossReason::Refused);
    assert!(guard.check().is_err());

    let other = LockClient::builder(backend)
        .owner(Owner::new("other")?)
        .build()?;
    let successor = other.try_lock("k").await?.ok_or("k is not free")?;
    assert!(successor.token() > guard.token());
    successor.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_put_again_under_another_lease_is_not_renewed() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=replaced", etcd.url())).await?;
    let p = measured(&backend).await;
    let (key, owner) = (LockKey::new("k")?, Owner::new("holder")?);
    // Alive until the renewal, so that what refuses it is the new key.
    let grant = acquire(&backend, &key, &owner, ttl(&p, 10)).await?;
    // Someone deletes the key and writes it again (a new create revision)
    // while the holder's lease lives on.
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    raw.delete(raw_key("replaced", "k"), None).await?;
    raw.put(raw_key("replaced", "k"), r#"{"owner":"holder"}"#, None)
        .await?;
    match backend
        .renew(
            &LeaseId::new(key.clone(), owner.clone(), grant.token),
            grant.ttl,
        )
        .await
    {
        Err(Error::NotHeld { .. }) => Ok(()),
        other => Err(format!("renewing a replaced key: {other:?}").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_with_another_ttl_moves_the_grant_to_a_lease_of_that_ttl() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let url = format!("{}?prefix=ttl", etcd.url());
    let holder = EtcdBackend::connect(&url).await?;
    let p = measured(&holder).await;
    // Three TTLs, each a lease of its own: short, long, and between.
    let (short, long, between) = (ttl(&p, 3), ttl(&p, 60), ttl(&p, 10));
    let (key, owner) = (LockKey::new("k")?, Owner::new("holder")?);
    let full = raw_key("ttl", "k");
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;

    let grant = acquire(&holder, &key, &owner, short).await?;
    assert_eq!(grant.ttl, short);
    let (created, first_lease) = key_state(&mut raw, &full).await?.ok_or("no key")?;
    assert_eq!(FencingToken(u64::try_from(created)?), grant.token);

    // Longer.
    let renewed = holder
        .renew(&LeaseId::new(key.clone(), owner.clone(), grant.token), long)
        .await
        .map_err(|e| format!("renewing the short grant: {e} [{p}]"))?;
    assert_eq!(renewed.token, grant.token);
    assert_eq!(renewed.ttl, long);
    let (created, lease) = key_state(&mut raw, &full).await?.ok_or("no key")?;
    assert_eq!(FencingToken(u64::try_from(created)?), grant.token);
    assert_ne!(lease, first_lease);
    let (granted, left) = lease_ttls(&mut raw, lease).await?;
    assert_eq!(granted, secs(long));
    assert!(left > secs(short), "the key's lease has {left} s left");
    // The old lease is not revoked: other grants of that TTL may share it;
    // with none left it simply expires.
    let (first_granted, _) = lease_ttls(&mut raw, first_lease).await?;
    assert_eq!(first_granted, secs(short));

    // The same TTL again keeps the lease.
    let again = holder
        .renew(&LeaseId::new(key.clone(), owner.clone(), grant.token), long)
        .await?;
    assert_eq!(again.ttl, long);
    assert_eq!(key_state(&mut raw, &full).await?.map(|s| s.1), Some(lease));

    // Another process (no cached lease) shortens it.
    let other_process = EtcdBackend::connect(&url).await?;
    let shorter = other_process
        .renew(
            &LeaseId::new(key.clone(), owner.clone(), grant.token),
            between,
        )
        .await?;
    assert_eq!(shorter.ttl, between);
    let (_, short_lease) = key_state(&mut raw, &full).await?.ok_or("no key")?;
    assert_eq!(lease_ttls(&mut raw, short_lease).await?.0, secs(between));
    assert_ne!(short_lease, lease, "the grant stayed on the holder's lease");

    // The holder's remembered lease is gone now; its renewal finds the
    // grant's current one.
    let back = holder
        .renew(
            &LeaseId::new(key.clone(), owner.clone(), grant.token),
            grant.ttl,
        )
        .await?;
    assert_eq!((back.token, back.ttl), (grant.token, grant.ttl));

    // A stranger and a stale token still cannot renew, with any TTL.
    let stranger = Owner::new("stranger")?;
    for (who, token) in [
        (&stranger, grant.token),
        (&owner, FencingToken(grant.token.0 - 1)),
    ] {
        match holder
            .renew(&LeaseId::new(key.clone(), who.clone(), token), long)
            .await
        {
            Err(Error::NotHeld { .. }) => {}
            other => return Err(format!("renew as {who} with {token}: {other:?}").into()),
        }
    }
    holder
        .release(&LeaseId::new(key.clone(), owner.clone(), grant.token))
        .await?;
    assert_eq!(key_state(&mut raw, &full).await?, None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_ttls_report_the_ttl_etcd_granted() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=small", etcd.url())).await?;
    let (key, owner) = (LockKey::new("k")?, Owner::new("holder")?);
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;

    let grant = acquire(&backend, &key, &owner, Duration::from_millis(1)).await?;
    let (_, lease) = key_state(&mut raw, &raw_key("small", "k"))
        .await?
        .ok_or("no key")?;
    let (granted, _) = lease_ttls(&mut raw, lease).await?;
    assert_eq!(grant.ttl, Duration::from_secs(u64::try_from(granted)?));
    assert!(grant.ttl >= Duration::from_secs(1));

    // Renewing with the small TTL asked for at first (`fencelock renew
    // --ttl 1ms`) is rounded up the same way and keeps the lease.
    let renewed = backend
        .renew(
            &LeaseId::new(key.clone(), owner.clone(), grant.token),
            Duration::from_millis(1),
        )
        .await?;
    assert_eq!(renewed.ttl, grant.ttl);
    assert_eq!(
        key_state(&mut raw, &raw_key("small", "k"))
            .await?
            .map(|s| s.1),
        Some(lease)
    );
    Ok(())
}

/// Acquires `keys` on `backend` for `ttl`, as (lease to renew, raw key).
async fn hold_all(
    backend: &EtcdBackend,
    prefix: &str,
    keys: &[&str],
    ttl: Duration,
) -> TestResult<Vec<(LeaseId, String)>> {
    let owner = Owner::new("holder")?;
    let mut held = Vec::new();
    for k in keys {
        let key = LockKey::new(*k)?;
        let grant = acquire(backend, &key, &owner, ttl).await?;
        held.push((
            LeaseId::new(key, owner.clone(), grant.token),
            raw_key(prefix, k),
        ));
    }
    Ok(held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_of_one_ttl_share_one_lease() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=shared", etcd.url())).await?;
    let p = measured(&backend).await;
    // Two TTLs, two leases.
    let (one, another) = (ttl(&p, 30), ttl(&p, 60));
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    let held = hold_all(&backend, "shared", &["a", "b"], one).await?;
    let other = hold_all(&backend, "shared", &["c"], another).await?;
    let lease_of = |state: Option<(i64, i64)>| state.map(|(_, lease)| lease);
    let a = lease_of(key_state(&mut raw, &held[0].1).await?).ok_or("no a")?;
    let b = lease_of(key_state(&mut raw, &held[1].1).await?).ok_or("no b")?;
    let c = lease_of(key_state(&mut raw, &other[0].1).await?).ok_or("no c")?;
    assert_eq!(a, b, "two grants of one TTL got two leases");
    assert_ne!(a, c, "grants of different TTLs share a lease");

    // One keep-alive renews both; the batch answers each, in order.
    let answers = backend
        .renew_many(&[
            Renewal::new(held[1].0.clone(), one),
            Renewal::new(held[0].0.clone(), one),
        ])
        .await?;
    assert_eq!(answers.len(), 2);
    assert_eq!(
        answers[0].as_ref().map(|g| g.token).ok(),
        Some(held[1].0.token)
    );
    assert_eq!(
        answers[1].as_ref().map(|g| g.token).ok(),
        Some(held[0].0.token)
    );
    assert_eq!(lease_of(key_state(&mut raw, &held[0].1).await?), Some(a));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_moved_key_is_not_held_for_its_lock_alone() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=fate", etcd.url())).await?;
    let ttl = ttl(&measured(&backend).await, 30);
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    let held = hold_all(&backend, "fate", &["gone", "moved", "kept"], ttl).await?;
    raw.delete(held[0].1.clone(), None).await?;
    // Someone attaches one key to a lease of their own.
    let foreign = raw.lease_grant(300, None).await?.id();
    raw.put(
        held[1].1.clone(),
        "",
        Some(PutOptions::new().with_lease(foreign).with_ignore_value()),
    )
    .await?;
    let renewals: Vec<Renewal> = held
        .iter()
        .map(|(lease, _)| Renewal::new(lease.clone(), ttl))
        .collect();
    let answers = backend.renew_many(&renewals).await?;
    assert!(
        matches!(answers[0], Err(Error::NotHeld { .. })),
        "deleted key: {:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Err(Error::NotHeld { .. })),
        "moved key: {:?}",
        answers[1]
    );
    assert_eq!(
        answers[2].as_ref().map(|g| g.token).ok(),
        Some(held[2].0.token),
        "the untouched key: {:?}",
        answers[2]
    );
    // The single renewal agrees.
    for (lease, _) in &held[..2] {
        match backend.renew(lease, ttl).await {
            Err(Error::NotHeld { .. }) => {}
            other => return Err(format!("renewing {}: {other:?}", lease.key).into()),
        }
    }
    backend.renew(&held[2].0, ttl).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_one_grant_leaves_the_others_on_the_lease() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let backend = EtcdBackend::connect(&format!("{}?prefix=release", etcd.url())).await?;
    let ttl = ttl(&measured(&backend).await, 30);
    let mut raw = Client::connect([etcd.endpoint(0)], None).await?;
    let held = hold_all(&backend, "release", &["a", "b"], ttl).await?;
    let (_, lease) = key_state(&mut raw, &held[1].1).await?.ok_or("no b")?;
    backend.release(&held[0].0).await?;
    assert_eq!(key_state(&mut raw, &held[0].1).await?, None);
    assert!(
        lease_ttls(&mut raw, lease).await?.1 > 0,
        "the release ended the shared lease"
    );
    let renewed = backend.renew(&held[1].0, ttl).await?;
    assert_eq!(renewed.token, held[1].0.token);
    assert_eq!(
        backend.inspect(&held[1].0.key).await?.map(|i| i.token),
        Some(held[1].0.token)
    );
    // The next grant of that TTL joins the same lease: no lease grant per
    // lock.
    let again = hold_all(&backend, "release", &["a"], ttl).await?;
    assert_eq!(
        key_state(&mut raw, &again[0].1).await?.map(|s| s.1),
        Some(lease)
    );
    Ok(())
}

/// How many requests of gRPC `method` etcd has started (its `/metrics`).
async fn started(endpoint: &str, method: &str) -> TestResult<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = endpoint.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(address).await?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    let label = format!("grpc_method=\"{method}\"");
    Ok(body
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cycle_is_one_txn_and_one_delete_txn() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let endpoint = etcd.endpoint(0);
    let backend = EtcdBackend::connect(&format!("{}?prefix=cycle", etcd.url())).await?;
    // One shared lease outlives the twenty cycles: a second would be a
    // second LeaseGrant.
    let lease = ttl(&measured(&backend).await, 30);
    let owner = Owner::new("cycler")?;
    let before = [
        started(&endpoint, "LeaseGrant").await?,
        started(&endpoint, "LeaseRevoke").await?,
        started(&endpoint, "Txn").await?,
    ];
    for i in 0..20 {
        let key = LockKey::new(format!("k{i}"))?;
        let grant = acquire(&backend, &key, &owner, lease).await?;
        backend
            .release(&LeaseId::new(key, owner.clone(), grant.token))
            .await?;
    }
    let after = [
        started(&endpoint, "LeaseGrant").await?,
        started(&endpoint, "LeaseRevoke").await?,
        started(&endpoint, "Txn").await?,
    ];
    let spent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!(
        "20 cycles: LeaseGrant {}, LeaseRevoke {}, Txn {}",
        spent[0], spent[1], spent[2]
    );
    assert_eq!(
        spent,
        [1, 0, 40],
        "[LeaseGrant, LeaseRevoke, Txn] for 20 cycles"
    );
    Ok(())
}
