//! `/v1/events` over backends that notify (`Backend::changes`: PostgreSQL,
//! Redis, etcd, ZooKeeper): a change made by a client of the backend itself, not of
//! the service, reaches a follower from the backend's notice, long before
//! the next listing (the services here list once an hour); an expiry is
//! reported as an expiry (announced by etcd, found by the service's reads
//! of due keys elsewhere); notices lost while the notification connection
//! was down are made up for; and a backend without notices still works by
//! listing. Real servers from the test kit.
//!
//! Time: real servers. Each test measures a [`Patience`] against its
//! direct client first and scales from it the bound on an event that must
//! come (base [`EVENT_BOUND`]), the leases that must outlive the test
//! (30 s), and the short leases whose grant the service must see before
//! their expiry (300 ms: a notice or listing that comes later than the
//! lease's end finds nothing to report acquired); a failure names the
//! budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use eventsource_stream::Eventsource;
use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockClient, LockKey, Owner};
use fencelock_etcd::EtcdBackend;
use fencelock_postgres::PostgresBackend;
use fencelock_redis::RedisBackend;
use fencelock_serve::{Server, ServerHandle, Service};
use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster, postgres::PostgresServer, redis::RedisServer, zookeeper::ZkServer,
    },
    Patience, TestResult,
};
use fencelock_zookeeper::ZkBackend;
use futures_util::{Stream, StreamExt};
use serde_json::Value;

/// The base of the bound on waiting for an event that must come; never a
/// timing assertion.
const EVENT_BOUND: Duration = Duration::from_secs(10);
/// The base of a lease that must outlive the test.
const LEASE: Duration = Duration::from_secs(30);
/// The base of a lease meant to expire under the follower's eyes.
const SHORT: Duration = Duration::from_millis(300);

/// A budget measured against `direct`, shown with any failure.
async fn measured(direct: &dyn Backend) -> Patience {
    let p = Patience::against(direct).await;
    eprintln!("time budget: {p}");
    p
}
/// Far beyond the test: every event seen came from a notice (or, for the
/// state before the first follower, from the one listing that seeds it).
const NEVER: Duration = Duration::from_secs(3600);

type Events =
    std::pin::Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, String>> + Send>>;

/// A service over `service_side`, listing every `interval`, and a follower
/// of its whole stream (its head received).
async fn follow(service_side: Arc<dyn Backend>, interval: Duration) -> (ServerHandle, Events) {
    let service = Service::builder(LockClient::new(service_side))
        .events_interval(interval)
        .build();
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap();
    let url = format!("http://{}/v1/events", server.local_addr());
    let handle = server.spawn();
    let response = reqwest::get(url).await.unwrap();
    assert!(response.status().is_success());
    let events = response
        .bytes_stream()
        .eventsource()
        .map(|e| e.map_err(|e| e.to_string()));
    (handle, Box::pin(events))
}

/// The next event about `key` (`resync` and other keys skipped), as
/// `(type, body)`, within `p.bound(EVENT_BOUND)`.
async fn next_of(events: &mut Events, key: &str, p: &Patience) -> (String, Value) {
    tokio::time::timeout(p.bound(EVENT_BOUND), async {
        loop {
            let event = events.next().await.expect("the stream ended").unwrap();
            if event.event == "resync" {
                continue;
            }
            let body: Value = serde_json::from_str(&event.data).unwrap();
            if body["key"] == key {
                return (event.event, body);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event about {key} arrived [{p}]"))
}

/// Takes `key` directly on `direct` for `ttl`; the lease.
async fn take(direct: &dyn Backend, key: &str, ttl: Duration) -> TestResult<LeaseId> {
    let request = AcquireRequest::new(LockKey::new(key)?, Owner::new("direct")?, ttl);
    match direct.try_acquire(&request).await? {
        Acquire::Granted(grant) => Ok(request.lease(grant.token)),
        held => Err(format!("{key} not granted: {held:?}").into()),
    }
}

/// What every notifying backend must show: `service_side` backs the
/// service, `direct` is another client of the same store.
async fn direct_changes_and_expiries_arrive_without_listing(
    service_side: Arc<dyn Backend>,
    direct: Arc<dyn Backend>,
) -> TestResult {
    let p = measured(direct.as_ref()).await;
    let (_server, mut events) = follow(service_side, NEVER).await;

    let lease = take(direct.as_ref(), "outside", p.ttl(LEASE)).await?;
    let token = lease.token.get();
    let (kind, body) = next_of(&mut events, "outside", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("acquired", Some(token))
    );
    direct.release(&lease).await?;
    let (kind, body) = next_of(&mut events, "outside", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("released", Some(token))
    );

    // Nobody announces an expiry: the service reads the key when its known
    // lease should have ended, and says so.
    let token = take(direct.as_ref(), "short", p.ttl(SHORT))
        .await?
        .token
        .get();
    let (kind, _) = next_of(&mut events, "short", &p).await;
    assert_eq!(kind, "acquired", "[{p}]");
    let (kind, body) = next_of(&mut events, "short", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("expired", Some(token))
    );
    Ok(())
}

#[tokio::test]
async fn redis_notices_bring_direct_changes_and_expiries_are_expiries() -> TestResult {
    let server = RedisServer::start()?;
    let service_side = RedisBackend::connect(&server.url()).await?;
    let direct = RedisBackend::connect(&server.url()).await?;
    direct_changes_and_expiries_arrive_without_listing(Arc::new(service_side), Arc::new(direct))
        .await
}

#[tokio::test]
async fn postgres_notices_bring_direct_changes_and_expiries_are_expiries() -> TestResult {
    let server = PostgresServer::start()?;
    let url = server.url("postgres");
    let service_side = PostgresBackend::connect(&url).await?;
    let direct = PostgresBackend::connect(&url).await?;
    direct_changes_and_expiries_arrive_without_listing(Arc::new(service_side), Arc::new(direct))
        .await
}

#[tokio::test]
async fn etcd_notices_bring_direct_changes_and_expiries_are_expiries() -> TestResult {
    let etcd = EtcdCluster::start()?;
    let url = format!("{}?prefix=notified", etcd.url());
    let service_side = EtcdBackend::connect(&url).await?;
    let direct = EtcdBackend::connect(&url).await?;
    direct_changes_and_expiries_arrive_without_listing(Arc::new(service_side), Arc::new(direct))
        .await
}

#[tokio::test]
async fn zookeeper_notices_bring_direct_changes_and_expiries_are_expiries() -> TestResult {
    let server = ZkServer::start()?;
    let service_side = ZkBackend::connect(&server.url()).await?;
    let direct = ZkBackend::connect(&server.url()).await?;
    direct_changes_and_expiries_arrive_without_listing(Arc::new(service_side), Arc::new(direct))
        .await
}

/// The etcd watch behind the notices breaks with the member the service
/// talks to: a change made on another member meanwhile is in no watch the
/// service opens afterwards, so only the listing that the reported loss
/// asks for can find it.
#[tokio::test]
async fn a_change_made_while_the_etcd_watch_was_down_still_arrives() -> TestResult {
    let etcd = EtcdCluster::start_members(3)?;
    let at = |i: usize| format!("etcd://{}?prefix=notified", etcd.endpoint(i));
    // The service's member is a follower, so the change needs no election.
    let leader = etcd.leader().ok_or("the cluster has no leader")?;
    let follower = (leader + 1) % etcd.len();
    let service_side = EtcdBackend::connect(&at(follower)).await?;
    let direct = EtcdBackend::connect(&at(leader)).await?;
    let p = measured(&direct).await;
    let (_server, mut events) = follow(Arc::new(service_side), NEVER).await;
    etcd.kill(follower)?;
    let token = take(&direct, "during", p.ttl(LEASE)).await?.token.get();
    etcd.start_again(follower)?;
    let (kind, body) = next_of(&mut events, "during", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("acquired", Some(token))
    );
    Ok(())
}

/// Notices lost while the notification connection was down are made up
/// for: the feed reports the loss and the service lists the backend again.
#[tokio::test]
async fn a_change_made_while_redis_notices_were_cut_off_still_arrives() -> TestResult {
    let server = RedisServer::start()?;
    let service_side = RedisBackend::connect(&server.url()).await?;
    let direct = RedisBackend::connect(&server.url()).await?;
    let p = measured(&direct).await;
    let (_server, mut events) = follow(Arc::new(service_side), NEVER).await;
    let mut admin = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    // Cuts every pub/sub connection, the service's included.
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await?;
    let token = take(&direct, "during", p.ttl(LEASE)).await?.token.get();
    let (kind, body) = next_of(&mut events, "during", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("acquired", Some(token))
    );
    Ok(())
}

/// SQLite has no notices: the listing every `--events-interval` finds both
/// a direct change and an expiry, as before.
#[tokio::test]
async fn a_backend_without_notices_is_listed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let service_side = fencelock_sqlite::SqliteBackend::connect(&url).await?;
    assert!(service_side.changes().await?.is_none());
    let direct = fencelock_sqlite::SqliteBackend::connect(&url).await?;
    let p = measured(&direct).await;
    let (_server, mut events) = follow(Arc::new(service_side), Duration::from_millis(50)).await;
    let token = take(&direct, "listed", p.ttl(SHORT)).await?.token.get();
    let (kind, _) = next_of(&mut events, "listed", &p).await;
    assert_eq!(kind, "acquired", "[{p}]");
    let (kind, body) = next_of(&mut events, "listed", &p).await;
    assert_eq!(
        (kind.as_str(), body["token"].as_u64()),
        ("expired", Some(token))
    );
    Ok(())
}
