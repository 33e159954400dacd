//! The small items of the service's hardening (`docs/http.md`, "Threat
//! model"): oversize bodies, one owner rule for every role, an unreadable
//! `Last-Event-ID`, events replayable after every follower left, and a
//! certificate error that says what is wrong.
//!
//! Time: a real service on a real socket. Each test measures a
//! [`Patience`] when it starts the service and scales from it the bound on
//! an event that must come (base [`EVENT_BOUND`]) and the leases that must
//! outlive the test (30 s); a failure names the budget. The service's own
//! 10 s body time-out is the figure under test. The second without a
//! follower is the scenario (a page reloaded), not a wait for anything.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use eventsource_stream::Eventsource;
use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
use fencelock_serve::{ServerHandle, Service, Tokens};
use fencelock_testkit::Patience;
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, serve};

const ADMIN: &str = "admin-0123456789abcdef";
const CLIENT: &str = "client-0123456789abcdef";
/// The base of the bound on waiting for an event that must come; never a
/// timing assertion.
const EVENT_BOUND: Duration = Duration::from_secs(10);
/// The base of a lease that must outlive the test.
const LEASE: Duration = Duration::from_secs(30);

struct Api {
    base: String,
    direct: LockClient,
    /// The budget measured when it started.
    p: Patience,
    _server: ServerHandle,
}

impl Api {
    async fn start() -> Self {
        let p = Patience::measure().await;
        let client = LockClient::new(Arc::new(MemoryBackend::new()));
        let service = Service::builder(client.clone())
            .fence(Arc::new(MemoryFence::new()))
            .events_interval(Duration::from_millis(20))
            .tokens(Tokens::parse(&format!("admin {ADMIN}\nclient {CLIENT}\n")).unwrap())
            .build();
        let (server, base) = serve(service).await;
        Self {
            base,
            direct: client,
            p,
            _server: server,
        }
    }

    /// `LEASE` scaled, in the API's milliseconds.
    fn lease_ms(&self) -> u64 {
        u64::try_from(self.p.ttl(LEASE).as_millis()).unwrap()
    }

    fn request(&self, token: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
    }

    async fn send(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        support::send(&self.base, Some(token), method, path, Some(body)).await
    }

    async fn follow(
        &self,
        last_id: Option<reqwest::header::HeaderValue>,
    ) -> impl futures_util::Stream<Item = eventsource_stream::Event> + Unpin {
        let mut request = self.request(ADMIN, Method::GET, "/v1/events");
        if let Some(id) = last_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        Box::pin(response.bytes_stream().eventsource().map(|e| e.unwrap()))
    }
}

async fn next(
    events: &mut (impl futures_util::Stream<Item = eventsource_stream::Event> + Unpin),
    p: &Patience,
) -> eventsource_stream::Event {
    tokio::time::timeout(p.bound(EVENT_BOUND), events.next())
        .await
        .unwrap_or_else(|_| panic!("no event [{p}]"))
        .expect("the stream ended")
}

#[tokio::test]
async fn an_oversize_body_is_a_413() {
    let api = Api::start().await;
    let huge = format!(
        "{{\"ttl_ms\": 1000, \"data\": \"{}\"}}",
        "x".repeat(3 << 20)
    );
    let response = api
        .request(ADMIN, Method::POST, "/v1/locks/k/acquire")
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "too_large", "{body}");
}

#[tokio::test]
async fn owners_follow_one_rule_whatever_the_role() {
    let api = Api::start().await;
    for token in [ADMIN, CLIENT] {
        for owner in ["", "a\u{7}b"] {
            let (status, body) = api
                .send(
                    token,
                    Method::POST,
                    "/v1/locks/k/acquire",
                    json!({"owner": owner, "ttl_ms": 5000}),
                )
                .await;
            assert_eq!(
                (status, body["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("invalid_owner")),
                "{token} as {owner:?}: {body}"
            );
        }
        let (status, body) = api
            .send(token, Method::POST, "/v1/owners/%20/release", Value::Null)
            .await;
        assert_eq!(status, StatusCode::OK, "a space is an owner: {body}");
    }
}

#[tokio::test]
async fn an_unreadable_last_event_id_gets_resync() {
    let api = Api::start().await;
    let id = reqwest::header::HeaderValue::from_bytes(b"caf\xe9-1").unwrap();
    let mut events = api.follow(Some(id)).await;
    assert_eq!(next(&mut events, &api.p).await.event, "resync");
}

/// Nobody follows the stream for a while: a follower that comes back
/// within the replay window still gets every event it missed, those of the
/// service and those made directly on the backend, and no `resync`.
#[tokio::test]
async fn events_stay_replayable_after_every_follower_left() {
    let api = Api::start().await;
    let mut events = api.follow(None).await;
    let (status, _) = api
        .send(
            ADMIN,
            Method::POST,
            "/v1/locks/before/acquire",
            json!({"owner": "w", "ttl_ms": api.lease_ms()}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let last = next(&mut events, &api.p).await;
    assert_eq!(last.event, "acquired");
    drop(events);
    // The stream has no follower now; the service keeps looking.
    let (status, _) = api
        .send(
            ADMIN,
            Method::POST,
            "/v1/locks/through/acquire",
            json!({"owner": "w", "ttl_ms": api.lease_ms()}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let outside = api
        .direct
        .lock("outside")
        .ttl(api.p.ttl(LEASE))
        .acquire()
        .await
        .unwrap();
    // A second later, as a reloaded page comes back: fifty listings of the
    // stream's interval, none with a follower.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut resumed = api
        .follow(Some(
            reqwest::header::HeaderValue::from_str(&last.id).unwrap(),
        ))
        .await;
    let mut keys = Vec::new();
    for _ in 0..2 {
        let e = next(&mut resumed, &api.p).await;
        assert_eq!(e.event, "acquired", "{e:?} [{}]", api.p);
        let body: Value = serde_json::from_str(&e.data).unwrap();
        keys.push(body["key"].as_str().unwrap().to_owned());
    }
    keys.sort();
    assert_eq!(keys, ["outside", "through"]);
    outside.release().await.unwrap();
}

/// A body sent slowly does not hold its connection (busy, so never idle)
/// for good: it is answered 408 once it took longer than 10 s, and the
/// connection closes.
#[tokio::test]
async fn a_body_that_never_arrives_is_a_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = Api::start().await;
    let addr = api.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(
            format!(
                "POST /v1/locks/k/acquire HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"ttl_ms\""
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10) + api.p.bound(EVENT_BOUND),
        socket.read_to_end(&mut answer),
    )
    .await
    .unwrap_or_else(|_| panic!("the connection outlived the body's time-out [{}]", api.p))
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
}
