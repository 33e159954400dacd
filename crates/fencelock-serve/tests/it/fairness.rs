//! Each client token's share of the backend (`docs/http.md`, "Threat
//! model"): a burst of one client's requests waits for that client's own
//! turns, and neither another client's calls nor the client's own renewals
//! wait for it; a long poll holds no turn.
//!
//! Time: no wait here is bounded by a clock: each step waits for what the
//! gated backend reports (turns in flight, attempts made). The leases and
//! the long poll's wait (30 s, in a SQLite file of the test's own) outlive
//! the test's local steps by far and keep their figures; a long poll that
//! kept its turn would hold the release for the whole wait and fail the
//! test on any machine.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Grant, LeaseId, LockClient, LockInfo, LockKey,
    Result, WakeSubscription,
};
use fencelock_serve::{ServerHandle, Service, Tokens};
use fencelock_sqlite::{SqliteBackend, SqliteOptions};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use crate::support::serve;

const HEAVY: &str = "heavy-0123456789abcdef";
const LIGHT: &str = "light-0123456789abcdef";

/// SQLite, with the acquisitions of keys named `burst-…` held at a gate
/// the test opens, and counted while they are in the backend.
#[derive(Debug)]
struct Gated {
    inner: SqliteBackend,
    gate: Semaphore,
    in_flight: watch::Sender<usize>,
    most: std::sync::atomic::AtomicUsize,
    /// Acquisition attempts of every key (the long poll's progress).
    attempts: watch::Sender<usize>,
}

#[async_trait]
impl Backend for Gated {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.attempts.send_modify(|n| *n += 1);
        if request.key.as_str().starts_with("burst-") {
            self.in_flight.send_modify(|n| {
                *n += 1;
                self.most.fetch_max(*n, std::sync::atomic::Ordering::SeqCst);
            });
            self.gate.acquire().await.unwrap().forget();
            self.in_flight.send_modify(|n| *n -= 1);
        }
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
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        self.inner.subscribe(key).await
    }
}

struct Api {
    base: String,
    backend: Arc<Gated>,
    _server: ServerHandle,
    _dir: tempfile::TempDir,
}

impl Api {
    /// The service over a gated SQLite store, with `per_client` turns.
    async fn start(per_client: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions::new(dir.path().join("locks.db"));
        let backend = Arc::new(Gated {
            inner: SqliteBackend::connect_with(options).await.unwrap(),
            gate: Semaphore::new(0),
            in_flight: watch::Sender::new(0),
            most: 0.into(),
            attempts: watch::Sender::new(0),
        });
        let tokens = format!("client {HEAVY} heavy\nclient {LIGHT} light\n");
        let service = Service::builder(LockClient::new(Arc::clone(&backend) as Arc<dyn Backend>))
            .tokens(Tokens::parse(&tokens).unwrap())
            .client_concurrency(per_client)
            .build();
        let (server, base) = serve(service).await;
        Self {
            base,
            backend,
            _server: server,
            _dir: dir,
        }
    }

    async fn send(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        crate::support::send(&self.base, Some(token), method, path, body).await
    }

    async fn acquire(&self, token: &str, key: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            token,
            Method::POST,
            &format!("/v1/locks/{key}/acquire"),
            Some(body),
        )
        .await
    }
}

#[tokio::test]
async fn a_clients_burst_waits_for_its_own_turns_not_for_others_or_its_renewals() {
    const TURNS: usize = 4;
    const BURST: usize = 40;
    let api = Arc::new(Api::start(TURNS).await);
    let (status, mine) = api
        .acquire(HEAVY, "mine", json!({"ttl_ms": 30000, "owner": "w"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{mine}");

    // A burst of single-key acquisitions, every one held in the backend.
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let api = Arc::clone(&api);
            tokio::spawn(async move {
                api.acquire(HEAVY, &format!("burst-{i}"), json!({"ttl_ms": 30000}))
                    .await
            })
        })
        .collect();
    let mut in_flight = api.backend.in_flight.subscribe();
    in_flight.wait_for(|n| *n >= TURNS).await.unwrap();

    // While its turns are taken: the client's renewal, one by one and in a
    // batch, and another client's calls.
    let (status, renewed) = api
        .send(
            HEAVY,
            Method::POST,
            "/v1/locks/mine/renew",
            Some(json!({"owner": "w", "token": mine["token"], "ttl_ms": 30000})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    let (status, renewed) = api
        .send(
            HEAVY,
            Method::POST,
            "/v1/renew",
            Some(json!({"leases": [
                {"key": "mine", "owner": "w", "token": mine["token"], "ttl_ms": 30000}
            ]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["results"][0]["status"], 200, "{renewed}");
    let (status, light) = api
        .acquire(LIGHT, "light", json!({"ttl_ms": 30000, "owner": "l"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{light}");
    let (status, listed) = api.send(LIGHT, Method::GET, "/v1/locks/light", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");

    api.backend.gate.add_permits(BURST);
    for request in burst {
        let (status, grant) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{grant}");
    }
    // However many it sent, the client had its turns' worth in the backend.
    assert_eq!(
        api.backend.most.load(std::sync::atomic::Ordering::SeqCst),
        TURNS
    );
}

#[tokio::test]
async fn a_long_poll_holds_no_turn() {
    // One turn: a waiting acquisition that kept it would keep the release
    // that ends its wait from running until the wait timed out.
    let api = Arc::new(Api::start(1).await);
    let (status, held) = api
        .acquire(HEAVY, "k", json!({"ttl_ms": 30000, "owner": "first"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let attempts_before = *api.backend.attempts.borrow();
    let waiter = {
        let api = Arc::clone(&api);
        tokio::spawn(async move {
            api.acquire(
                HEAVY,
                "k",
                json!({"ttl_ms": 30000, "owner": "second", "wait_ms": 30000}),
            )
            .await
        })
    };
    // The first try and the wait's own first attempt were refused.
    let mut attempts = api.backend.attempts.subscribe();
    attempts
        .wait_for(|n| *n >= attempts_before + 2)
        .await
        .unwrap();
    let (status, released) = api
        .send(
            HEAVY,
            Method::POST,
            "/v1/locks/k/release",
            Some(json!({"owner": "first", "token": held["token"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    let (status, grant) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{grant}");
    assert_eq!(grant["owner"], "second");
}
