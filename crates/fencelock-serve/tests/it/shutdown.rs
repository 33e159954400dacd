//! Shutdown with long polls pending: they are answered at once with a 503
//! that sends their client elsewhere, and the server is done well inside a
//! supervisor's stop timeout (`docs/http.md`, "Connections and their
//! limits").
//!
//! Time: real services on real sockets. Each test measures a [`Patience`]
//! first and scales from it the waits for a long poll to show or a waiter
//! to be granted, and the bound on a shutdown (base [`STOP_BOUND`]); the
//! latter stays below [`NEVER_WAITED`], the shortest long-poll stretch a
//! shutdown must not wait out, which is what it tells apart. A failure
//! names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{Backend, LockClient, MemoryBackend, MemoryFence};
use fencelock_http::HttpBackend;
use fencelock_serve::{Server, ServerHandle, Service};
use fencelock_testkit::Patience;
use tokio::time::Instant;

/// What systemd allows the unit shipped in deploy/ less a margin: a
/// shutdown must be done by then, whatever is pending (the base of the
/// bound).
const STOP_BOUND: Duration = Duration::from_secs(10);
/// Less than a long poll's stretch (a third of its TTL, at most 20 s): a
/// shutdown that waited for one would take that long.
const NEVER_WAITED: Duration = Duration::from_secs(15);

/// The bound on a shutdown: [`STOP_BOUND`] scaled, below [`NEVER_WAITED`].
fn stop_bound(p: &Patience) -> Duration {
    p.bound(STOP_BOUND).min(NEVER_WAITED)
}

async fn replica(backend: Arc<MemoryBackend>) -> (ServerHandle, String) {
    let backend: Arc<dyn Backend> = backend;
    let service = Service::builder(LockClient::new(backend))
        .fence(Arc::new(MemoryFence::new()))
        .build();
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    (server.spawn(), addr)
}

/// Waits until `addr` counts `n` long polls, for at most
/// `p.bound(STOP_BOUND)`.
async fn waiters(http: &reqwest::Client, addr: &str, n: u64, p: &Patience) {
    tokio::time::timeout(p.bound(STOP_BOUND), async {
        loop {
            let stats: serde_json::Value = http
                .get(format!("http://{addr}/v1/stats"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if stats["waiters"] == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the long poll never showed in /v1/stats [{p}]"));
}

#[tokio::test]
async fn a_shutdown_answers_a_60_s_long_poll_at_once_and_ends_quickly() {
    let p = Patience::measure().await;
    let (handle, addr) = replica(Arc::new(MemoryBackend::new())).await;
    let http = reqwest::Client::new();
    let acquire = |owner: &'static str, wait_ms: u64| {
        http.post(format!("http://{addr}/v1/locks/k/acquire"))
            .json(&serde_json::json!({"owner": owner, "ttl_ms": 120000, "wait_ms": wait_ms}))
            .send()
    };
    assert_eq!(acquire("a", 0).await.unwrap().status(), 200);
    let poll = tokio::spawn(acquire("b", 60_000));
    let all = tokio::spawn({
        let http = http.clone();
        let addr = addr.clone();
        async move {
            http.post(format!("http://{addr}/v1/acquire"))
                .json(&serde_json::json!({"keys": ["k", "j"], "owner": "c", "ttl_ms": 5000, "wait_ms": 60000}))
                .send()
                .await
        }
    });
    waiters(&http, &addr, 2, &p).await;

    let stopping = Instant::now();
    let bound = stop_bound(&p);
    tokio::time::timeout(bound, handle.shutdown())
        .await
        .unwrap_or_else(|_| panic!("the shutdown waited for the long polls [{p}]"));
    for answer in [poll.await.unwrap().unwrap(), all.await.unwrap().unwrap()] {
        assert_eq!(answer.status(), 503);
        assert_eq!(answer.headers()["retry-after"], "1");
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["code"], "unavailable", "{body}");
        assert_eq!(body["retry_after_ms"], 1000, "{body}");
    }
    assert!(stopping.elapsed() < bound, "[{p}]");
}

/// A library client given two replicas, waiting through the first, keeps
/// waiting through the second when the first shuts down, and gets the lock
/// there: the 503 is a transient refusal, and the replica that sent it no
/// longer takes connections.
#[tokio::test]
async fn a_waiting_client_moves_to_the_other_replica_when_its_replica_shuts_down() {
    let p = Patience::measure().await;
    let backend = Arc::new(MemoryBackend::new());
    let (first, first_addr) = replica(Arc::clone(&backend)).await;
    let (_second, second_addr) = replica(Arc::clone(&backend)).await;
    let direct = LockClient::new(Arc::clone(&backend) as Arc<dyn Backend>);
    let holder = direct
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();

    let url = format!("http://{first_addr},{second_addr}");
    let through = LockClient::new(Arc::new(HttpBackend::connect(&url).await.unwrap()));
    let waiter = tokio::spawn(async move {
        through
            .lock("k")
            // A long poll's stretch is a third of the TTL, at most 20 s:
            // longer than the bound on the shutdown.
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    waiters(&reqwest::Client::new(), &first_addr, 1, &p).await;
    tokio::time::timeout(stop_bound(&p), first.shutdown())
        .await
        .unwrap_or_else(|_| panic!("the shutdown waited for the long poll [{p}]"));
    // The waiter asks the second replica now.
    waiters(&reqwest::Client::new(), &second_addr, 1, &p).await;
    let token = holder.token();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(p.bound(STOP_BOUND), waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not granted after the release [{p}]"))
        .unwrap()
        .unwrap();
    assert!(guard.token() > token);
    guard.release().await.unwrap();
}
