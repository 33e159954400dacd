//! Several `fencelock serve` replicas over one backend behave as one
//! service (docs/http.md, "Several replicas"): behind HAProxy, and with a
//! client given every replica's address. One replica is killed with
//! SIGKILL, or stopped with SIGSTOP (hung: it accepts connections and
//! answers nothing), while clients hold locks and others wait for them: the
//! holders keep renewing through the other replicas, no lease the backend
//! holds is lost, a new client gets its lock at once, the waiters are
//! granted once the holders release, and every token is above the one
//! before it on its key.
//!
//! Time: real servers and replicas. Each scenario measures a [`Patience`]
//! against the replicas (scheduling delay and round trip) before the fault
//! and scales from it the holders' lease (base [`TTL`]), and with it the
//! time it watches them renew (three leases), the waiters' wait and the
//! newcomer's bound; a failure names the budget. The newcomer's bound
//! stays below the 30 s a request to the sick replica would take: that is
//! what it tells apart.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{path::Path, time::Duration};

use fencelock::{LockClient, LockGuard, Owner};
use fencelock_testkit::{
    servers::{
        postgres::PostgresServer,
        redis::RedisServer,
        replicas::{Haproxy, ServeReplicas},
    },
    Patience,
};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// The base of the holders' lease: short, so that a renewal lost with the
/// replica would show as a loss within the test.
const TTL: Duration = Duration::from_secs(3);
/// What a request to the sick replica would wait before it timed out.
const SICK_REPLICA_TIMEOUT: Duration = Duration::from_secs(30);
const HOLDERS: usize = 6;

async fn client(url: &str, owner: &str) -> LockClient {
    LockClient::builder(fencelock::open_backend(url).await.unwrap())
        .owner(Owner::new(owner).unwrap())
        .build()
        .unwrap()
}

/// What befalls replica 0.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL: its connections are refused.
    Kill,
    /// SIGSTOP for the whole check, SIGCONT after it.
    Hang,
}

/// How the client reaches the replicas.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    /// HAProxy's address: until its checks take a hung replica out, it
    /// sends requests there, and only those sent twice get past.
    Balancer,
    /// Every replica's address: the client leaves a sick one behind.
    EveryAddress,
}

/// The scenario: holders on `url` (which reaches the replicas), waiters
/// for the same keys, replica 0 (the one a client given every address
/// starts with) killed or hung, then the hand-over. `backend` is the
/// backend itself, read to check what it holds.
async fn survive(replicas: &ServeReplicas, url: &str, via: Via, backend: &str, fault: Fault) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("fencelock_core=debug,fencelock_http=debug")
        .with_test_writer()
        .try_init();
    let holders = client(url, "holder").await;
    let p = Patience::against(&**holders.backend()).await;
    let ttl = p.ttl(TTL);
    let mut guards: Vec<LockGuard> = Vec::new();
    for i in 0..HOLDERS {
        guards.push(
            holders
                .lock(format!("order:{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let mut waiters = Vec::new();
    let wait = p.bound(Duration::from_secs(60));
    for i in 0..HOLDERS {
        let url = url.to_owned();
        waiters.push(tokio::spawn(async move {
            let waiter = client(&url, &format!("waiter-{i}")).await;
            let guard = waiter
                .lock(format!("order:{i}"))
                .ttl(ttl)
                .wait(wait)
                .acquire()
                .await;
            (waiter, guard)
        }));
    }

    match fault {
        Fault::Kill => replicas.kill(0).unwrap(),
        Fault::Hang => replicas.pause(0).unwrap(),
    }
    // Several renewals (one every third of the TTL) must go through the
    // replicas left, each within its lease.
    let renewals_before: Vec<_> = guards.iter().map(|g| g.expires_at()).collect();
    let started = tokio::time::Instant::now();
    // A new client, which knows nothing of the fault, gets a free key well
    // before a request to the sick replica would have timed out.
    if via == Via::EveryAddress {
        let bound = p
            .bound(Duration::from_secs(10))
            .min(SICK_REPLICA_TIMEOUT * 5 / 6);
        let newcomer = tokio::time::timeout(bound, async {
            let fresh = client(url, "newcomer").await;
            let guard = fresh.lock("newcomer").ttl(ttl).acquire().await.unwrap();
            guard.release().await.unwrap();
        })
        .await;
        assert!(
            newcomer.is_ok(),
            "a new client got no lock within {bound:?} of the fault [{p}]"
        );
    }
    tokio::time::sleep_until(started + ttl * 3).await;
    let direct = client(backend, "observer").await;
    for (guard, before) in guards.iter().zip(renewals_before) {
        guard
            .check()
            .unwrap_or_else(|e| panic!("{}: {e} [{p}]", guard.key()));
        assert!(
            guard.expires_at() > before,
            "{} was not renewed after the kill [{p}]",
            guard.key()
        );
        let held = direct
            .backend()
            .inspect(guard.key())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (&held.owner, held.token),
            (guard.owner(), guard.token()),
            "the backend lost or changed {} [{p}]",
            guard.key()
        );
    }
    for waiter in &waiters {
        assert!(!waiter.is_finished(), "a waiter was granted a held key");
    }
    if fault == Fault::Hang {
        replicas.resume(0).unwrap();
    }

    let tokens: Vec<_> = guards.iter().map(|g| g.token()).collect();
    for guard in guards {
        guard.release().await.unwrap();
    }
    for (waiter, before) in waiters.into_iter().zip(tokens) {
        let (_client, guard) = waiter.await.unwrap();
        let guard = guard.unwrap_or_else(|e| panic!("a waiter: {e} [{p}]"));
        assert!(
            guard.token() > before,
            "{}: token {} after {before}",
            guard.key(),
            guard.token()
        );
        guard.release().await.unwrap();
    }
    // A new acquisition after all this still draws a higher token.
    if fault == Fault::Kill {
        replicas.start_again(0).unwrap();
    }
    let again = holders.lock("order:0").ttl(ttl).acquire().await.unwrap();
    let last = direct
        .backend()
        .inspect(again.key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last.token, again.token());
    again.release().await.unwrap();
}

async fn behind_haproxy(backend: &str, fault: Fault) {
    let replicas = ServeReplicas::start(Path::new(BIN), backend, 3, &[]).unwrap();
    let ports: Vec<u16> = (0..replicas.len()).map(|i| replicas.port(i)).collect();
    let balancer = Haproxy::start(&ports).unwrap();
    survive(&replicas, &balancer.url(), Via::Balancer, backend, fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_postgres_behind_haproxy_survive_a_kill() {
    let server = PostgresServer::start().unwrap();
    behind_haproxy(&server.url("postgres"), Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_redis_behind_haproxy_survive_a_kill() {
    let server = RedisServer::start_persistent().unwrap();
    behind_haproxy(&server.url(), Fault::Kill).await;
}

/// Until HAProxy's checks take the hung replica out, requests it sends
/// there wait: renewals are sent again (HAProxy gives the copy to another
/// replica), the rest wait for their own time-outs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_redis_behind_haproxy_survive_a_hung_one() {
    let server = RedisServer::start_persistent().unwrap();
    behind_haproxy(&server.url(), Fault::Hang).await;
}

/// No balancer: the client is given the three addresses and moves to the
/// next replica when one refuses its connections. Replica 0, the one it
/// starts with, is the one killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_every_replica_fails_over_by_itself() {
    let server = RedisServer::start_persistent().unwrap();
    let replicas = ServeReplicas::start(Path::new(BIN), &server.url(), 3, &[]).unwrap();
    survive(
        &replicas,
        &replicas.url_of_all(),
        Via::EveryAddress,
        &server.url(),
        Fault::Kill,
    )
    .await;
}

/// The same with replica 0 hung: requests it does not answer move on
/// within `replica_timeout` (renewals within a sixth of their lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_every_replica_leaves_a_hung_one_behind() {
    let server = RedisServer::start_persistent().unwrap();
    let replicas = ServeReplicas::start(Path::new(BIN), &server.url(), 3, &[]).unwrap();
    survive(
        &replicas,
        &replicas.url_of_all(),
        Via::EveryAddress,
        &server.url(),
        Fault::Hang,
    )
    .await;
}

/// A list of replicas with a hole in it is a bad URL, not a panic.
#[tokio::test]
async fn a_bad_list_of_replicas_is_an_invalid_url() {
    for url in [
        "http://127.0.0.1:1,,127.0.0.1:2",
        "http://127.0.0.1:1,127.0.0.1:notaport",
    ] {
        let opened = fencelock::open_backend(url).await;
        assert!(
            matches!(opened, Err(fencelock::Error::InvalidUrl(_))),
            "{url}: {opened:?}"
        );
    }
}
