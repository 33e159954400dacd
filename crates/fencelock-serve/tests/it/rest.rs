//! The REST contract of `docs/http.md`, against a real server on a loopback
//! port over the memory backend.
//!
//! Time: a real service on a real socket. Each test's service measures a
//! [`Patience`] when it starts, and every wait for something that must
//! come (an event, a waiter in the statistics, an activity entry) is
//! bounded by [`EVENT_BOUND`] scaled from it ([`event_bound`]); a failure
//! names the budget. The leases (30 s and more, in the service's own
//! memory store) outlive a test's few local requests by far and keep
//! their figures, which many answers are checked against; the 200 ms
//! without a follower is the scenario, not a wait for anything.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use eventsource_stream::Eventsource;
use fencelock_core::{Backend, LockClient, LockKey, MemoryBackend, MemoryFence};
use fencelock_serve::{Server, ServerHandle, Service, Tokens};
use fencelock_testkit::{patience, Patience};
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const ADMIN: &str = "admin-0123456789abcdef";
const CLIENT: &str = "client-0123456789abcdef";
/// A second client, in a namespace of its own.
const OTHER: &str = "other-0123456789abcdef";
/// The base of the bound on waiting for an event that must come; never a
/// timing assertion.
const EVENT_BOUND: Duration = Duration::from_secs(10);

/// [`EVENT_BOUND`] scaled by the budget the test's service measured.
fn event_bound() -> Duration {
    patience::current().bound(EVENT_BOUND)
}

struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<&'static str>,
    /// A library client of the service's backend, for changes made
    /// outside the service.
    direct: LockClient,
    _server: Arc<ServerHandle>,
}

impl Api {
    async fn start(tokens: bool) -> Self {
        Self::over(Arc::new(MemoryBackend::new()), tokens).await
    }

    /// A service over `backend`.
    async fn over(backend: Arc<dyn Backend>, tokens: bool) -> Self {
        // The budget the test's bounds take, shown with any failure.
        let p = Patience::measure().await;
        eprintln!("time budget: {p}");
        let client = LockClient::new(backend);
        let direct = client.clone();
        let mut service = Service::builder(client)
            .fence(Arc::new(MemoryFence::new()))
            .events_interval(Duration::from_millis(20));
        if tokens {
            let file =
                format!("# test tokens\nadmin {ADMIN}\nclient {CLIENT}\nclient {OTHER} billing\n");
            service = service.tokens(Tokens::parse(&file).unwrap());
        }
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), service.build())
            .await
            .unwrap();
        let base = format!("http://{}", server.local_addr());
        Self {
            base,
            http: reqwest::Client::new(),
            token: tokens.then_some(ADMIN),
            direct,
            _server: Arc::new(server.spawn()),
        }
    }

    fn as_token(&self, token: Option<&'static str>) -> Self {
        Self {
            base: self.base.clone(),
            http: self.http.clone(),
            token,
            direct: self.direct.clone(),
            _server: Arc::clone(&self._server),
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.request(method, path);
        if let Some(body) = body {
            r = r.json(&body);
        }
        let response = r.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    async fn raw(&self, method: Method, path: &str, body: &'static str) -> (StatusCode, Value) {
        let response = self
            .request(method, path)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn acquire(&self, key: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            Method::POST,
            &format!("/v1/locks/{key}/acquire"),
            Some(body),
        )
        .await
    }
}

/// A refusal: the status, a one-line reason and the expected code.
fn refused(answer: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(answer.0, status, "{answer:?}");
    assert_eq!(answer.1["code"], code, "{answer:?}");
    let reason = answer.1["error"].as_str().unwrap();
    assert!(!reason.is_empty() && !reason.contains('\n'), "{reason:?}");
}

/// The TTL a lease was granted with is shown for as long as the lease
/// lives, whether or not anyone follows the event stream: while nobody does,
/// the service forgets what listings told it every events interval (20 ms
/// here), but not its own grants.
#[tokio::test]
async fn the_ttl_of_a_grant_outlives_intervals_without_followers() {
    let api = Api::start(false).await;
    let (status, grant) = api
        .acquire("kept", json!({"owner": "alice", "ttl_ms": 30000}))
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    // Ten events intervals with nobody following the stream.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, lock) = api.send(Method::GET, "/v1/locks/kept", None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    assert_eq!(lock["ttl_ms"], 30000, "{lock}");
}

#[tokio::test]
async fn a_lock_is_acquired_inspected_renewed_and_released() {
    let api = Api::start(false).await;
    let (status, grant) = api
        .acquire(
            "order:1",
            json!({"owner": "alice", "ttl_ms": 30000, "kind": "workflow", "data": {"step": 2}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    assert_eq!(grant["key"], "order:1");
    assert_eq!(grant["owner"], "alice");
    assert_eq!(grant["ttl_ms"], 30000);
    assert!(grant["expires_at"].is_string());
    let token = grant["token"].as_u64().unwrap();

    let held = api
        .acquire("order:1", json!({"owner": "bob", "ttl_ms": 30000}))
        .await;
    refused(&held, StatusCode::CONFLICT, "held");
    assert_eq!(held.1["holder"]["owner"], "alice");
    assert_eq!(held.1["holder"]["token"], token);

    let (status, lock) = api.send(Method::GET, "/v1/locks/order:1", None).await;
    assert_eq!(status, StatusCode::OK);
    for field in [
        "key",
        "kind",
        "owner",
        "token",
        "acquired_at",
        "expires_at",
        "ttl_ms",
        "data",
    ] {
        assert!(!lock[field].is_null(), "{field} missing from {lock}");
    }
    assert_eq!(lock["data"], json!({"step": 2}));
    assert_eq!(lock["kind"], "workflow");

    let (status, list) = api.send(Method::GET, "/v1/locks?prefix=order:", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["locks"].as_array().unwrap().len(), 1);
    let (_, none) = api.send(Method::GET, "/v1/locks?prefix=zzz", None).await;
    assert_eq!(none["locks"], json!([]));

    let renewed = api
        .send(
            Method::POST,
            "/v1/locks/order:1/renew",
            Some(json!({"owner": "alice", "token": token, "ttl_ms": 60000})),
        )
        .await;
    assert_eq!(renewed.0, StatusCode::OK, "{renewed:?}");
    assert_eq!(renewed.1["token"], token);
    assert_eq!(renewed.1["ttl_ms"], 60000);

    // A stranger and a stale token neither renew nor release (I3).
    for (owner, t) in [("bob", token), ("alice", token - 1)] {
        let body = json!({"owner": owner, "token": t});
        refused(
            &api.send(Method::POST, "/v1/locks/order:1/renew", Some(body.clone()))
                .await,
            StatusCode::CONFLICT,
            "not_held",
        );
        refused(
            &api.send(Method::POST, "/v1/locks/order:1/release", Some(body))
                .await,
            StatusCode::CONFLICT,
            "not_held",
        );
    }
    let released = api
        .send(
            Method::POST,
            "/v1/locks/order:1/release",
            Some(json!({"owner": "alice", "token": token})),
        )
        .await;
    assert_eq!(released.0, StatusCode::OK, "{released:?}");
    refused(
        &api.send(Method::GET, "/v1/locks/order:1", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let (status, next) = api.acquire("order:1", json!({"ttl_ms": 1000})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(next["token"].as_u64().unwrap() > token, "{next}");
    assert!(
        !next["owner"].as_str().unwrap().is_empty(),
        "a generated owner"
    );
}

#[tokio::test]
async fn keys_are_percent_decoded_from_the_path() {
    let api = Api::start(false).await;
    let (status, grant) = api
        .acquire("jobs%2Fnightly%20report", json!({"ttl_ms": 5000}))
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    assert_eq!(grant["key"], "jobs/nightly report");
    let (status, lock) = api
        .send(Method::GET, "/v1/locks/jobs%2Fnightly%20report", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(lock["key"], "jobs/nightly report");
}

#[tokio::test]
async fn bad_input_is_a_400_with_a_one_line_reason() {
    let api = Api::start(false).await;
    let post = Method::POST;
    refused(
        &api.raw(post.clone(), "/v1/locks/k/acquire", "{\"ttl_ms\": ")
            .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    refused(
        &api.raw(post.clone(), "/v1/locks/k/acquire", "[1, 2]").await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    let cases = [
        ("/v1/locks/k/acquire", json!({}), "bad_request"),
        ("/v1/locks/k/acquire", json!({"ttl_ms": -1}), "bad_request"),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": "30s"}),
            "bad_request",
        ),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": 1000, "color": 1}),
            "bad_request",
        ),
        ("/v1/locks/k/acquire", json!({"ttl_ms": 0}), "invalid_ttl"),
        ("/v1/locks/k/acquire", json!({"ttl_ms": 99}), "invalid_ttl"),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": u64::MAX}),
            "invalid_ttl",
        ),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": 1000, "wait_ms": 3_600_000}),
            "bad_request",
        ),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": 1000, "owner": ""}),
            "invalid_owner",
        ),
        (
            "/v1/locks/k/acquire",
            json!({"ttl_ms": 1000, "kind": ""}),
            "bad_request",
        ),
        (
            "/v1/locks/a%01b/acquire",
            json!({"ttl_ms": 1000}),
            "invalid_key",
        ),
        (
            "/v1/locks/%FF/acquire",
            json!({"ttl_ms": 1000}),
            "bad_request",
        ),
        (
            "/v1/locks/k/renew",
            json!({"owner": "o", "token": 1, "ttl_ms": 5}),
            "invalid_ttl",
        ),
        ("/v1/locks/k/release", json!({"owner": "o"}), "bad_request"),
        (
            "/v1/locks/k/release",
            json!({"owner": "o", "token": -3}),
            "bad_request",
        ),
        ("/v1/fences/r/admit", json!({"token": "x"}), "bad_request"),
        ("/v1/fences/a%00b/admit", json!({"token": 1}), "invalid_key"),
    ];
    for (path, body, code) in cases {
        let answer = api.send(post.clone(), path, Some(body.clone())).await;
        assert_eq!(
            answer.0,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {answer:?}"
        );
        refused(&answer, StatusCode::BAD_REQUEST, code);
    }
    let long = "k".repeat(256);
    refused(
        &api.send(Method::GET, &format!("/v1/locks/{long}"), None)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_key",
    );
    // A parser's message that quotes a huge request is shortened, not
    // echoed whole.
    let mut huge = serde_json::Map::new();
    huge.insert("ttl_ms".into(), json!(1000));
    huge.insert("x".repeat(10_000), json!(1));
    let answer = api
        .send(
            post.clone(),
            "/v1/locks/k/acquire",
            Some(Value::Object(huge)),
        )
        .await;
    refused(&answer, StatusCode::BAD_REQUEST, "bad_request");
    let error = answer.1["error"].as_str().unwrap_or_default();
    assert!(
        error.len() < 600 && error.ends_with("bytes)"),
        "{} bytes: {}",
        error.len(),
        &error[..error.len().min(600)]
    );
    refused(
        &api.send(Method::PUT, "/v1/kv/k", Some(json!({"value": 1})))
            .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    refused(
        &api.send(Method::GET, "/v2/nothing", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
}

/// A client token cannot renew, release, re-label or release-all a lease
/// taken with another client token, even knowing its owner and token from
/// `GET /v1/locks/{key}` (which used to be all `release` asked for); the
/// holder keeps its lease, and each client sees its own owners as it named
/// them.
#[tokio::test]
async fn a_client_token_cannot_touch_another_clients_lease() {
    let admin = Api::start(true).await;
    let holder = admin.as_token(Some(OTHER));
    let stranger = admin.as_token(Some(CLIENT));

    let (status, grant) = holder
        .acquire("orders-1", json!({"ttl_ms": 60000, "owner": "worker-1"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    assert_eq!(
        grant["owner"], "worker-1",
        "the holder sees the owner it named"
    );
    let (status, seen) = stranger.send(Method::GET, "/v1/locks/orders-1", None).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(
        seen["owner"], "billing/worker-1",
        "others see the namespace"
    );
    let (_, own) = holder.send(Method::GET, "/v1/locks/orders-1", None).await;
    assert_eq!(own["owner"], "worker-1");

    // Everything a reader of the lock learns, tried as the stranger.
    for owner in [&seen["owner"], &grant["owner"]] {
        let named = json!({"owner": owner, "token": seen["token"]});
        for path in ["/v1/locks/orders-1/release", "/v1/locks/orders-1/renew"] {
            refused(
                &stranger.send(Method::POST, path, Some(named.clone())).await,
                StatusCode::CONFLICT,
                "not_held",
            );
        }
        let relabel = json!({"owner": owner, "token": seen["token"], "data": {"x": 1}});
        refused(
            &stranger
                .send(Method::PUT, "/v1/locks/orders-1/data", Some(relabel))
                .await,
            StatusCode::CONFLICT,
            "not_held",
        );
        let owner = owner.as_str().unwrap().replace('/', "%2F");
        let (status, all) = stranger
            .send(Method::POST, &format!("/v1/owners/{owner}/release"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{all}");
        assert_eq!(
            all["released"], 0,
            "release-all took another client's lease"
        );
    }
    let (status, still) = admin.send(Method::GET, "/v1/locks/orders-1", None).await;
    assert_eq!(status, StatusCode::OK, "{still}");
    assert_eq!(still["token"], grant["token"]);
    assert_eq!(
        still["owner"], "billing/worker-1",
        "the admin sees stored owners"
    );

    // The holder renews and releases with what it was given.
    let own = json!({"owner": "worker-1", "token": grant["token"]});
    let (status, renewed) = holder
        .send(Method::POST, "/v1/locks/orders-1/renew", Some(own.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["owner"], "worker-1");
    let (status, released) = holder
        .send(Method::POST, "/v1/locks/orders-1/release", Some(own))
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
}

#[tokio::test]
async fn tokens_are_required_and_admin_routes_need_an_admin() {
    let admin = Api::start(true).await;
    let anonymous = admin.as_token(None);
    let client = admin.as_token(Some(CLIENT));

    let (status, health) = anonymous.send(Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    for path in ["/v1/locks", "/v1/stats", "/metrics", "/v1/events"] {
        refused(
            &anonymous.send(Method::GET, path, None).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        );
    }
    let wrong = admin.as_token(Some("client-0123456789abcdeX"));
    refused(
        &wrong.send(Method::GET, "/v1/locks", None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );

    let (status, grant) = client.acquire("stuck", json!({"ttl_ms": 60000})).await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    refused(
        &client.send(Method::DELETE, "/v1/locks/stuck", None).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    refused(
        &client.send(Method::POST, "/v1/cleanup", None).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    let (status, removed) = admin.send(Method::DELETE, "/v1/locks/stuck", None).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["removed"]["token"], grant["token"]);
    refused(
        &admin.send(Method::DELETE, "/v1/locks/stuck", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let (status, cleaned) = admin.send(Method::POST, "/v1/cleanup", None).await;
    assert_eq!(status, StatusCode::OK, "{cleaned}");
    assert!(cleaned["deleted"].is_u64());
    // The holder learns of the loss at its next renewal.
    refused(
        &client
            .send(
                Method::POST,
                "/v1/locks/stuck/renew",
                Some(json!({"owner": grant["owner"], "token": grant["token"]})),
            )
            .await,
        StatusCode::CONFLICT,
        "not_held",
    );
}

#[tokio::test]
async fn fences_and_the_fenced_store_refuse_lower_tokens() {
    let api = Api::start(false).await;
    let admit = |t: u64| {
        api.send(
            Method::POST,
            "/v1/fences/ledger/admit",
            Some(json!({"token": t})),
        )
    };
    let (status, fence) = admit(5).await;
    assert_eq!(status, StatusCode::OK, "{fence}");
    assert_eq!(fence["current"], 5);
    assert_eq!(
        admit(5).await.0,
        StatusCode::OK,
        "the same holder writes again"
    );
    let stale = admit(4).await;
    refused(&stale, StatusCode::CONFLICT, "stale");
    assert_eq!(stale.1["current"], 5);
    let (_, current) = api.send(Method::GET, "/v1/fences/ledger", None).await;
    assert_eq!(current["current"], 5);

    let put = |t: u64, v: Value| {
        api.send(
            Method::PUT,
            "/v1/kv/ledger",
            Some(json!({"token": t, "value": v})),
        )
    };
    refused(&put(4, json!("old")).await, StatusCode::CONFLICT, "stale");
    let (status, stored) = put(5, json!({"balance": 10})).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    let (status, stored) = put(7, json!({"balance": 12})).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    let late = put(6, json!({"balance": 0})).await;
    refused(&late, StatusCode::CONFLICT, "stale");
    assert_eq!(late.1["current"], 7);
    let (status, value) = api.send(Method::GET, "/v1/kv/ledger", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        value,
        json!({"key": "ledger", "token": 7, "value": {"balance": 12}})
    );
    refused(
        &api.send(Method::GET, "/v1/kv/empty", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
}

/// Follows `/v1/events` (filtered by `query`) until `kinds` have all been
/// seen, in order.
async fn expect_events(
    events: &mut (impl futures_util::Stream<Item = Result<eventsource_stream::Event, impl std::fmt::Debug>>
              + Unpin),
    kinds: &[&str],
) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut want = kinds.iter().peekable();
    tokio::time::timeout(event_bound(), async {
        while let Some(kind) = want.peek() {
            let event = events.next().await.expect("the stream ended").unwrap();
            let body: Value = serde_json::from_str(&event.data).unwrap();
            assert_eq!(body["type"], event.event, "{body}");
            if event.event == **kind {
                want.next();
                seen.push(body);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("events {kinds:?} did not all arrive; saw {seen:?}"));
    seen
}

async fn follow(
    api: &Api,
    query: &str,
) -> impl futures_util::Stream<Item = Result<eventsource_stream::Event, impl std::fmt::Debug>> + Unpin
{
    let response = api
        .request(Method::GET, &format!("/v1/events{query}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.bytes_stream().eventsource()
}

#[tokio::test]
async fn events_report_acquisitions_releases_losses_expiries_and_fenced_out_writes() {
    let api = Api::start(false).await;
    let mut events = follow(&api, "").await;
    let (_, grant) = api
        .acquire("ev", json!({"owner": "o", "ttl_ms": 30000, "kind": "job"}))
        .await;
    api.send(
        Method::POST,
        "/v1/locks/ev/release",
        Some(json!({"owner": "o", "token": grant["token"]})),
    )
    .await;
    let seen = expect_events(&mut events, &["acquired", "released"]).await;
    assert_eq!(seen[0]["key"], "ev");
    assert_eq!(seen[0]["token"], grant["token"]);
    assert_eq!(seen[1]["token"], grant["token"]);

    let (_, grant) = api.acquire("ev", json!({"ttl_ms": 30000})).await;
    api.send(Method::DELETE, "/v1/locks/ev", None).await;
    let seen = expect_events(&mut events, &["acquired", "lost"]).await;
    assert_eq!(seen[1]["token"], grant["token"]);

    // No call announces an expiry: the listing finds it.
    let (_, grant) = api.acquire("short", json!({"ttl_ms": 150})).await;
    let seen = expect_events(&mut events, &["acquired", "expired"]).await;
    assert_eq!(seen[1]["key"], "short");
    assert_eq!(seen[1]["token"], grant["token"]);

    api.send(
        Method::POST,
        "/v1/fences/f/admit",
        Some(json!({"token": 9})),
    )
    .await;
    api.send(
        Method::POST,
        "/v1/fences/f/admit",
        Some(json!({"token": 3})),
    )
    .await;
    let seen = expect_events(&mut events, &["fenced_out"]).await;
    assert_eq!(seen[0]["token"], 3);
    assert_eq!(seen[0]["current"], 9);

    // A filtered stream sees only its key.
    let mut only = follow(&api, "?key=mine").await;
    api.acquire("other", json!({"ttl_ms": 30000})).await;
    api.acquire("mine", json!({"ttl_ms": 30000})).await;
    let seen = expect_events(&mut only, &["acquired"]).await;
    assert_eq!(seen[0]["key"], "mine");
}

/// A grant the service made itself reaches followers with the whole lease,
/// as `GET /v1/locks/{key}` shows it (`expires_in_ms` aside, which counts
/// down), so that an `http://` watch has nothing to read: the backend sees
/// no read of the key between the grant and the watch's report of it.
#[tokio::test]
async fn the_services_own_grants_carry_the_lease_and_a_watch_reads_nothing() {
    use fencelock_core::{fault::FaultyBackend, HolderChange};
    use fencelock_http::HttpBackend;
    let backend = FaultyBackend::new(Arc::new(MemoryBackend::new()));
    let api = Api::over(backend.clone(), false).await;
    let mut events = follow(&api, "?key=rec").await;
    let key = LockKey::new("rec").unwrap();
    let mut watch = HttpBackend::connect(&api.base)
        .await
        .unwrap()
        .watch(&key)
        .await
        .unwrap();
    let reads = backend.inspect_calls();

    let (status, grant) = api
        .acquire(
            "rec",
            json!({"owner": "o", "ttl_ms": 30000, "kind": "job", "data": {"shard": 7}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let change = tokio::time::timeout(event_bound(), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let HolderChange::Acquired(info) = change else {
        panic!("{change:?}")
    };
    assert_eq!(info.token.get(), grant["token"].as_u64().unwrap());
    assert_eq!(
        (info.kind.as_deref(), info.data),
        (Some("job"), Some(json!({"shard": 7})))
    );
    assert_eq!(backend.inspect_calls(), reads, "the watch read the key");

    let seen = expect_events(&mut events, &["acquired"]).await;
    let (status, mut shown) = api.send(Method::GET, "/v1/locks/rec", None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    let mut lock = seen[0]["lock"].clone();
    for record in [&mut lock, &mut shown] {
        let left = record.as_object_mut().unwrap().remove("expires_in_ms");
        assert!(left.and_then(|v| v.as_u64()).is_some(), "{record}");
    }
    assert_eq!(lock, shown);
}

#[tokio::test]
async fn the_first_follower_hears_of_changes_made_outside_the_service_after_its_head() {
    let api = Api::start(false).await;
    let before = api
        .direct
        .lock("before")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // Nobody followed the stream until now: the head comes after the
    // service has listed the backend, so a lock taken directly right after
    // it is a change, not part of the first view.
    let mut events = follow(&api, "").await;
    let outside = api
        .direct
        .lock("outside")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let seen = expect_events(&mut events, &["acquired"]).await;
    assert_eq!(seen[0]["key"], "outside");
    assert_eq!(seen[0]["token"], outside.token().get());
    // And the lock held before the head was in that first view.
    before.release().await.unwrap();
    let seen = expect_events(&mut events, &["released"]).await;
    assert_eq!(seen[0]["key"], "before");
    outside.release().await.unwrap();
}

#[tokio::test]
async fn a_long_poll_is_woken_by_the_release_and_counted_as_a_waiter() {
    let api = Arc::new(Api::start(false).await);
    let (_, first) = api
        .acquire("queue", json!({"owner": "a", "ttl_ms": 60000}))
        .await;
    let waiter = {
        let api = Arc::clone(&api);
        tokio::spawn(async move {
            api.acquire(
                "queue",
                json!({"owner": "b", "ttl_ms": 5000, "wait_ms": 30000}),
            )
            .await
        })
    };
    // The waiter shows in the statistics while it waits.
    tokio::time::timeout(event_bound(), async {
        loop {
            let (_, stats) = api.send(Method::GET, "/v1/stats", None).await;
            if stats["waiters"] == 1 {
                assert_eq!(stats["held"], 1, "{stats}");
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiter never showed in /v1/stats");
    api.send(
        Method::POST,
        "/v1/locks/queue/release",
        Some(json!({"owner": "a", "token": first["token"]})),
    )
    .await;
    let (status, second) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["owner"], "b");
    assert!(second["token"].as_u64() > first["token"].as_u64());
    let (_, stats) = api.send(Method::GET, "/v1/stats", None).await;
    assert_eq!(stats["waiters"], 0, "{stats}");

    // A wait that runs out is a 409 with the holder.
    let timed_out = api
        .acquire(
            "queue",
            json!({"owner": "c", "ttl_ms": 5000, "wait_ms": 50}),
        )
        .await;
    refused(&timed_out, StatusCode::CONFLICT, "held");
    assert_eq!(timed_out.1["holder"]["owner"], "b");
}

#[tokio::test]
async fn metrics_have_help_lines_and_the_scrape_time_gauges() {
    let api = Api::start(false).await;
    api.acquire("m:1", json!({"ttl_ms": 60000, "kind": "workflow"}))
        .await;
    api.acquire("m:2", json!({"ttl_ms": 60000})).await;
    let response = api.request(Method::GET, "/metrics").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    for help in [
        "# HELP fencelock_backend_held ",
        "# HELP fencelock_service_waiters ",
        "# HELP fencelock_backend_expired_not_cleaned ",
        "# HELP fencelock_backend_oldest_hold_seconds ",
        "# HELP fencelock_acquire_attempts_total ",
        "# HELP fencelock_acquire_successes_total ",
    ] {
        assert!(text.contains(help), "{help} missing from\n{text}");
    }
    for sample in [
        "fencelock_backend_held{backend=\"memory\",kind=\"workflow\"} 1",
        "fencelock_backend_held{backend=\"memory\",kind=\"\"} 1",
        "fencelock_service_waiters{backend=\"memory\"} 0",
        "fencelock_backend_expired_not_cleaned{backend=\"memory\"} 0",
    ] {
        assert!(text.contains(sample), "{sample} missing from\n{text}");
    }
    // Every fencelock metric has its HELP line.
    for line in text.lines().filter(|l| l.starts_with("fencelock_")) {
        let name = line.split(['{', ' ']).next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# HELP {base} ")) || text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
    }
}

/// The `http://` backend inside a client namespace: the library client
/// renews, inspects (seeing its own owner as it named it), and releases its
/// leases and election terms; another client token's library client can
/// neither take nor release them.
#[tokio::test]
async fn the_http_backend_works_inside_its_namespace() {
    use fencelock_core::{Error, LeaseId, Owner};
    use fencelock_http::HttpBackend;
    let api = Api::start(true).await;
    let address = api.base.trim_start_matches("http://");
    let connect = |token: &str| {
        let url = format!("http://:{token}@{address}");
        async move {
            LockClient::builder(Arc::new(HttpBackend::connect(&url).await.unwrap()))
                .owner(Owner::new("worker").unwrap())
                .build()
                .unwrap()
        }
    };
    // An unknown token is `unauthorized` (the REST API's code for a 401),
    // not `internal`.
    let stranger = format!("http://:not-a-token-of-this-service@{address}");
    match HttpBackend::connect(&stranger).await {
        Ok(backend) => {
            let stranger = LockClient::new(Arc::new(backend));
            let refused = stranger.lock("mine").acquire().await.unwrap_err();
            assert_eq!(refused.code(), "unauthorized", "{refused}");
        }
        Err(refused) => assert_eq!(refused.code(), "unauthorized", "{refused}"),
    }
    let mine = connect(OTHER).await;
    let theirs = connect(CLIENT).await;

    let guard = mine
        .lock("job")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert_eq!(guard.owner().as_str(), "worker");
    guard.renew().await.unwrap();
    let seen = mine.backend().inspect(guard.key()).await.unwrap().unwrap();
    assert_eq!((&seen.owner, seen.token), (guard.owner(), guard.token()));
    let theirs_seen = theirs
        .backend()
        .inspect(guard.key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(theirs_seen.owner.as_str(), "billing/worker");

    // The same owner name in another namespace is another owner.
    assert!(theirs.lock("job").try_acquire().await.unwrap().is_none());
    for owner in [guard.owner().clone(), theirs_seen.owner.clone()] {
        let stolen = theirs
            .backend()
            .release(&LeaseId::new(guard.key().clone(), owner, guard.token()))
            .await;
        assert!(matches!(stolen, Err(Error::NotHeld { .. })), "{stolen:?}");
    }
    assert!(guard.check().is_ok());
    guard.release().await.unwrap();

    let term = mine.election("scheduler").campaign().await.unwrap();
    let leader = theirs
        .election("scheduler")
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.owner.as_str(), "billing/worker");
    let leader = mine.election("scheduler").leader().await.unwrap().unwrap();
    assert_eq!(&leader.owner, mine.owner());
    term.resign().await.unwrap();
}

/// The text of `/metrics`.
async fn scrape(api: &Api) -> String {
    api.request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of one sample of `/metrics` (0 when absent).
async fn sample(api: &Api, series: &str) -> f64 {
    scrape(api)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Renewals of HTTP clients reach `/metrics` under the library's names,
/// so the shipped Grafana panels and alerts work for every language: two
/// confirmed renewals, and a refused one counted as a failure and a loss.
/// (Other tests of this process only ever add, so the deltas are lower
/// bounds.)
#[tokio::test]
async fn renewals_and_losses_of_http_clients_are_counted() {
    let api = Api::start(false).await;
    let renewals = "fencelock_renewals_total{backend=\"memory\"}";
    let failures = "fencelock_renewal_failures_total{backend=\"memory\"}";
    let lost = "fencelock_locks_lost_total{backend=\"memory\",reason=\"refused\"}";
    let before = [
        sample(&api, renewals).await,
        sample(&api, failures).await,
        sample(&api, lost).await,
    ];
    let (status, grant) = api
        .acquire("counted", json!({"ttl_ms": 60000, "owner": "w"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    for _ in 0..2 {
        let (status, renewed) = api
            .send(
                Method::POST,
                "/v1/locks/counted/renew",
                Some(json!({"owner": "w", "token": grant["token"]})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{renewed}");
    }
    let stale = json!({"owner": "w", "token": grant["token"].as_u64().unwrap() + 1});
    refused(
        &api.send(Method::POST, "/v1/locks/counted/renew", Some(stale))
            .await,
        StatusCode::CONFLICT,
        "not_held",
    );
    let after = [
        sample(&api, renewals).await,
        sample(&api, failures).await,
        sample(&api, lost).await,
    ];
    assert!(
        after[0] - before[0] >= 2.0,
        "renewals {before:?} → {after:?}"
    );
    assert!(
        after[1] - before[1] >= 1.0,
        "failures {before:?} → {after:?}"
    );
    assert!(after[2] - before[2] >= 1.0, "losses {before:?} → {after:?}");
    let text = scrape(&api).await;
    assert!(
        text.contains("fencelock_renew_seconds_count{backend=\"memory\"}"),
        "{text}"
    );
}

/// Every event has an id; a follower that reconnects with `Last-Event-ID`
/// gets what it missed, in order, before the live events, and one whose id
/// this service cannot resume from (another replica, or this one before a
/// restart) gets `resync` first.
#[tokio::test]
async fn a_follower_resumes_from_its_last_event_id() {
    let api = Api::start(false).await;
    // A second follower keeps the stream's view complete while the first
    // is away, as a service with several followers has.
    let mut keeper = follow(&api, "").await;
    let mut events = follow(&api, "").await;
    let (_, first) = api.acquire("resume-1", json!({"ttl_ms": 30000})).await;
    let last = tokio::time::timeout(event_bound(), events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(last.event, "acquired");
    assert!(!last.id.is_empty(), "an event without an id: {last:?}");
    drop(events);

    // Missed while away.
    let (_, second) = api.acquire("resume-2", json!({"ttl_ms": 30000})).await;
    api.send(
        Method::POST,
        "/v1/locks/resume-1/release",
        Some(json!({"owner": first["owner"], "token": first["token"]})),
    )
    .await;
    expect_events(&mut keeper, &["acquired", "acquired", "released"]).await;

    let resumed = api
        .request(Method::GET, "/v1/events")
        .header("Last-Event-ID", &last.id)
        .send()
        .await
        .unwrap();
    let mut resumed = resumed.bytes_stream().eventsource();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let e = tokio::time::timeout(event_bound(), resumed.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let body: Value = serde_json::from_str(&e.data).unwrap();
        seen.push((e.event, body["key"].clone(), body["token"].clone(), e.id));
    }
    assert_eq!(seen[0].0, "acquired");
    assert_eq!(
        (&seen[0].1, &seen[0].2),
        (&json!("resume-2"), &second["token"])
    );
    assert_eq!(seen[1].0, "released");
    assert_eq!(
        (&seen[1].1, &seen[1].2),
        (&json!("resume-1"), &first["token"])
    );
    assert!(seen[0].3 != last.id && seen[1].3 != seen[0].3, "{seen:?}");
    // Then live.
    api.acquire("resume-3", json!({"ttl_ms": 30000})).await;
    let live = expect_events(&mut resumed, &["acquired"]).await;
    assert_eq!(live[0]["key"], "resume-3");

    // An id from another run of the service cannot be resumed from.
    let stranger = api
        .request(Method::GET, "/v1/events")
        .header("Last-Event-ID", "0.0-1")
        .send()
        .await
        .unwrap();
    let mut stranger = stranger.bytes_stream().eventsource();
    let e = tokio::time::timeout(event_bound(), stranger.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(e.event, "resync");
}

/// `POST /v1/renew` renews a client's leases in one request, each judged
/// as its own renewal would be: a lease of another client or one that is
/// gone is refused in its place, a bad key is bad input in its place, and
/// the others are renewed. A batch over the limit is bad input as a whole.
#[tokio::test]
async fn a_batch_renews_each_lease_as_its_own_renewal_would() {
    let api = Api::start(true).await;
    let mine = api.as_token(Some(CLIENT));
    let theirs = api.as_token(Some(OTHER));
    let (_, a) = mine
        .acquire("batch:a", json!({"owner": "w", "ttl_ms": 5000}))
        .await;
    let (_, b) = mine
        .acquire("batch:b", json!({"owner": "w", "ttl_ms": 5000}))
        .await;
    let (_, c) = theirs
        .acquire("batch:c", json!({"owner": "w", "ttl_ms": 5000}))
        .await;
    let (status, answer) = mine
        .send(
            Method::POST,
            "/v1/renew",
            Some(json!({"leases": [
                {"key": "batch:a", "owner": "w", "token": a["token"], "ttl_ms": 60000},
                {"key": "batch:c", "owner": "w", "token": c["token"], "ttl_ms": 60000},
                {"key": "", "owner": "w", "token": 1},
                {"key": "batch:b", "owner": "w", "token": b["token"], "ttl_ms": 60000},
                {"key": "batch:a", "owner": "w", "token": 999},
            ]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 409, 400, 200, 409], "{answer}");
    assert_eq!(results[0]["grant"]["ttl_ms"], 60000);
    assert_eq!(results[0]["grant"]["owner"], "w");
    assert_eq!(results[1]["error"]["code"], "not_held");
    assert_eq!(results[2]["error"]["code"], "invalid_key");
    // The other client's lease kept its own length.
    let held = api
        .direct
        .backend()
        .inspect(&LockKey::new("batch:c").unwrap())
        .await;
    assert!(held.unwrap().unwrap().expires_in <= Duration::from_secs(5));

    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"key": format!("k{i}"), "owner": "w", "token": 1}))
        .collect();
    let answer = mine
        .send(Method::POST, "/v1/renew", Some(json!({ "leases": many })))
        .await;
    refused(&answer, StatusCode::BAD_REQUEST, "bad_request");
}

/// `POST /v1/acquire` takes every key or none: a set with one held key is
/// refused as held (naming the holder), and takes nothing.
#[tokio::test]
async fn several_keys_are_taken_all_or_nothing() {
    let api = Api::start(true).await;
    let mine = api.as_token(Some(CLIENT));
    let (status, all) = mine
        .send(
            Method::POST,
            "/v1/acquire",
            Some(json!({"keys": ["acct:2", "acct:1"], "owner": "t", "ttl_ms": 30000})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{all}");
    let grants = all["grants"].as_array().unwrap();
    assert_eq!(grants[0]["key"], "acct:1");
    assert_eq!(grants[1]["key"], "acct:2");
    assert_eq!(grants[0]["owner"], "t");

    let answer = mine
        .send(
            Method::POST,
            "/v1/acquire",
            Some(json!({"keys": ["acct:3", "acct:2"], "owner": "u", "ttl_ms": 30000})),
        )
        .await;
    refused(&answer, StatusCode::CONFLICT, "held");
    assert_eq!(answer.1["holder"]["key"], "acct:2");
    let free = api
        .direct
        .backend()
        .inspect(&LockKey::new("acct:3").unwrap())
        .await
        .unwrap();
    assert!(free.is_none(), "a refused set left acct:3 held: {free:?}");
    let answer = mine
        .send(
            Method::POST,
            "/v1/acquire",
            Some(json!({"keys": [], "ttl_ms": 1000})),
        )
        .await;
    refused(&answer, StatusCode::BAD_REQUEST, "bad_request");
}

/// Reads `GET /v1/activity` until `done` holds for it (within
/// `EVENT_BOUND`, which only bounds a failure); returns that answer.
async fn activity_until(api: &Api, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let found = tokio::time::timeout(event_bound(), async {
        loop {
            let (status, body) = api.send(Method::GET, "/v1/activity", None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if done(&body) {
                return body;
            }
            last = body;
            tokio::task::yield_now().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("/v1/activity never showed {what}: {last}"))
}

fn total(series: &Value) -> u64 {
    series
        .as_array()
        .map_or(0, |s| s.iter().filter_map(Value::as_u64).sum())
}

#[tokio::test]
async fn activity_lists_waiters_per_key_and_election_standbys() {
    let api = Arc::new(Api::start(true).await);
    let client = Arc::new(api.as_token(Some(CLIENT)));
    let (_, job) = client
        .acquire("job:1", json!({"owner": "holder", "ttl_ms": 60000}))
        .await;
    let election = "fencelock%2Felection%2Fsched";
    let (_, leader) = client
        .acquire(election, json!({"owner": "leader-a", "ttl_ms": 60000}))
        .await;
    let long_poll = |key: &'static str, owner: &'static str| {
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            client
                .acquire(
                    key,
                    json!({"owner": owner, "ttl_ms": 60000, "wait_ms": 30000}),
                )
                .await
        })
    };
    let waiters = [
        long_poll("job:1", "w1"),
        long_poll("job:1", "w2"),
        long_poll(election, "standby-b"),
    ];
    let seen = activity_until(&client, "two waiters on job:1 and a standby", |a| {
        a["waiters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w["key"] == "job:1" && w["count"] == 2)
            && a["elections"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["election"] == "sched" && e["standbys"][0]["owner"] == "standby-b")
    })
    .await;
    let job_waiters = seen["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["key"] == "job:1")
        .unwrap();
    // The client sees owners of its own namespace as it wrote them, the
    // longest waiting first.
    let owners: Vec<&str> = job_waiters["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners.len(), 2, "{seen}");
    assert!(owners.contains(&"w1") && owners.contains(&"w2"), "{seen}");
    let waited: Vec<u64> = job_waiters["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["waited_ms"].as_u64().unwrap())
        .collect();
    assert!(waited[0] >= waited[1], "{seen}");
    assert_eq!(job_waiters["longest_ms"], waited[0]);
    assert_eq!(seen["elections"][0]["key"], "fencelock/election/sched");
    assert_eq!(seen["elections"][0]["standbys"][0]["source"], "service");
    // The memory backend keeps no queue of its own.
    assert_eq!(seen["backend_queue"], false);
    let (_, stats) = client.send(Method::GET, "/v1/stats", None).await;
    assert_eq!(stats["waiters"], 3, "{stats}");

    // Released: a waiter is granted, its wait counted; the other still waits.
    client
        .send(
            Method::POST,
            "/v1/locks/job:1/release",
            Some(json!({"owner": "holder", "token": job["token"]})),
        )
        .await;
    client
        .send(
            Method::POST,
            &format!("/v1/locks/{election}/release"),
            Some(json!({"owner": "leader-a", "token": leader["token"]})),
        )
        .await;
    let seen = activity_until(&client, "one waiter left and two waits counted", |a| {
        a["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1 && w[0]["key"] == "job:1" && w[0]["count"] == 1)
            && total(&a["wait_ms"]["counts"]) >= 4
    })
    .await;
    assert_eq!(
        seen["wait_ms"]["counts"].as_array().unwrap().len(),
        seen["wait_ms"]["bounds_ms"].as_array().unwrap().len() + 1
    );
    // A lease released through the service has a hold time.
    assert!(total(&seen["hold_ms"]["counts"]) >= 2, "{seen}");
    for waiter in waiters {
        waiter.abort();
    }
    activity_until(&client, "no waiter once their requests are gone", |a| {
        a["waiters"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
}

#[tokio::test]
async fn activity_keeps_lease_lengths_renewals_and_refused_renewals() {
    let api = Api::start(true).await;
    let client = api.as_token(Some(CLIENT));
    let (_, grant) = client
        .acquire("lease:1", json!({"owner": "w", "ttl_ms": 30000}))
        .await;
    let token = grant["token"].as_u64().unwrap();
    let note = |a: &Value| {
        a["leases"]
            .as_array()
            .and_then(|l| l.iter().find(|n| n["key"] == "lease:1").cloned())
            .unwrap_or(Value::Null)
    };
    let (_, seen) = client.send(Method::GET, "/v1/activity", None).await;
    let first = note(&seen);
    assert_eq!(first["token"], token, "{seen}");
    assert_eq!(first["ttl_ms"], 30000);
    assert_eq!(first["renewed_at"], Value::Null);
    assert_eq!(first["renewals"], 0);

    let (status, _) = client
        .send(
            Method::POST,
            "/v1/locks/lease:1/renew",
            Some(json!({"owner": "w", "token": token, "ttl_ms": 45000})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = client
        .send(
            Method::POST,
            "/v1/renew",
            Some(json!({"leases": [{"key": "lease:1", "owner": "w", "token": token, "ttl_ms": 50000}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, seen) = client.send(Method::GET, "/v1/activity", None).await;
    let renewed = note(&seen);
    assert_eq!(renewed["ttl_ms"], 50000, "{seen}");
    assert_eq!(renewed["renewals"], 2);
    assert!(renewed["renewed_at"].is_string(), "{seen}");
    assert_eq!(renewed["renewal_failures"], 0);

    // Force-released by the admin: a loss; the holder's next renewal is
    // refused: a second one, kept with its owner.
    let (status, _) = api.send(Method::DELETE, "/v1/locks/lease:1", None).await;
    assert_eq!(status, StatusCode::OK);
    let refused_renewal = client
        .send(
            Method::POST,
            "/v1/locks/lease:1/renew",
            Some(json!({"owner": "w", "token": token})),
        )
        .await;
    refused(&refused_renewal, StatusCode::CONFLICT, "not_held");
    let (_, seen) = client.send(Method::GET, "/v1/activity", None).await;
    let kinds: Vec<&str> = seen["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["renewal_refused", "lost"], "{seen}");
    assert_eq!(seen["incidents"][0]["owner"], "w");
    assert_eq!(seen["incidents"][0]["token"], token);
    assert_eq!(
        note(&seen),
        Value::Null,
        "the ended lease keeps a note: {seen}"
    );
    assert_eq!(total(&seen["rates"]["lost"]), 2, "{seen}");
    assert_eq!(total(&seen["rates"]["acquired"]), 1, "{seen}");
}

#[tokio::test]
async fn losses_and_fenced_out_writes_outlive_the_event_stream_and_are_bounded() {
    let api = Api::start(false).await;
    let (_, grant) = api
        .acquire("victim", json!({"owner": "v", "ttl_ms": 60000}))
        .await;
    api.send(Method::DELETE, "/v1/locks/victim", None).await;
    // Many more events than a page keeps, none of them a loss.
    for _ in 0..60 {
        let (_, g) = api
            .acquire("busy", json!({"owner": "b", "ttl_ms": 60000}))
            .await;
        api.send(
            Method::POST,
            "/v1/locks/busy/release",
            Some(json!({"owner": "b", "token": g["token"]})),
        )
        .await;
    }
    let (_, seen) = api.send(Method::GET, "/v1/activity", None).await;
    assert_eq!(seen["incidents"][0]["type"], "lost", "{seen}");
    assert_eq!(seen["incidents"][0]["key"], "victim");
    assert_eq!(seen["incidents"][0]["token"], grant["token"]);
    assert_eq!(total(&seen["rates"]["acquired"]), 61, "{seen}");
    assert_eq!(total(&seen["rates"]["released"]), 60, "{seen}");
    assert_eq!(
        seen["rates"]["acquired"].as_array().unwrap().len(),
        300,
        "five minutes of seconds"
    );

    // Fenced-out writes fill the bounded history; the oldest go first.
    api.send(
        Method::POST,
        "/v1/fences/res/admit",
        Some(json!({"token": 1_000_000})),
    )
    .await;
    for token in 1..=501u64 {
        let (status, _) = api
            .send(
                Method::POST,
                "/v1/fences/res/admit",
                Some(json!({"token": token})),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT);
    }
    let (_, seen) = api.send(Method::GET, "/v1/activity", None).await;
    let incidents = seen["incidents"].as_array().unwrap();
    assert_eq!(incidents.len(), 500);
    assert_eq!(incidents[0]["type"], "fenced_out");
    assert_eq!(incidents[0]["token"], 501);
    assert_eq!(incidents[0]["current"], 1_000_000);
    assert_eq!(
        incidents[499]["token"], 2,
        "the loss and token 1 are the oldest, dropped"
    );
    assert_eq!(total(&seen["rates"]["fenced_out"]), 501);
}
