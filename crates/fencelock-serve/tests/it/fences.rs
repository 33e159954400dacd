//! Fences that cannot be bricked (`docs/http.md`, "Threat model"): a
//! token no grant can have issued is refused at a fence and at the fenced
//! store, so one request cannot refuse every later holder at a resource.
//!
//! Time: a real service on a real socket. The wait for the reset on the
//! event stream is bounded by 10 s scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first; a failure
//! names the budget. The leases (30 s, in the service's own memory store)
//! outlive the test's few local requests by far and keep their figures.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;

use fencelock_core::{Fence, LockClient, MemoryBackend, MemoryFence};
use fencelock_serve::{ServerHandle, Service};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, serve};

/// The highest token any store issues: 2^53 − 1.
const MAX: u64 = (1 << 53) - 1;

async fn start() -> (ServerHandle, String) {
    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .fence_shares_store(true)
        .build();
    serve(service).await
}

async fn send(base: &str, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
    support::send(base, None, method, path, Some(body)).await
}

fn invalid_token(answer: &(StatusCode, Value)) {
    assert_eq!(answer.0, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(answer.1["code"], "invalid_token", "{answer:?}");
}

#[tokio::test]
async fn tokens_no_grant_issued_are_refused_at_fences_and_the_fenced_store() {
    let (_server, base) = start().await;
    for token in [0, MAX + 1, u64::MAX] {
        invalid_token(
            &send(
                &base,
                Method::POST,
                "/v1/fences/r/admit",
                json!({"token": token}),
            )
            .await,
        );
        invalid_token(
            &send(
                &base,
                Method::PUT,
                "/v1/kv/r",
                json!({"token": token, "value": 1}),
            )
            .await,
        );
    }
    // Nothing was recorded: the fence and the store are as new.
    let (_, fence) = send(&base, Method::GET, "/v1/fences/r", Value::Null).await;
    assert_eq!(fence["current"], Value::Null, "{fence}");

    // Held, the key's live lease has the latest token the store issued: a
    // higher one at the resource of the same name was never issued.
    let (status, grant) = send(
        &base,
        Method::POST,
        "/v1/locks/r/acquire",
        json!({"owner": "w", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let token = grant["token"].as_u64().unwrap();
    invalid_token(
        &send(
            &base,
            Method::POST,
            "/v1/fences/r/admit",
            json!({"token": token + 1}),
        )
        .await,
    );
    invalid_token(
        &send(
            &base,
            Method::PUT,
            "/v1/kv/r",
            json!({"token": MAX, "value": 1}),
        )
        .await,
    );
    // The holder's own token passes, at the fence and in the store.
    let (status, admitted) = send(
        &base,
        Method::POST,
        "/v1/fences/r/admit",
        json!({"token": token}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{admitted}");
    assert_eq!(admitted["current"], token);
    let (status, written) = send(
        &base,
        Method::PUT,
        "/v1/kv/r",
        json!({"token": token, "value": {"n": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{written}");

    // Released, the key is free: the store still issued nothing above the
    // last grant, at this resource or one never locked. (Before, a free key
    // took any token up to 2^53 - 1, blocking its resource for good.)
    let (status, released) = send(
        &base,
        Method::POST,
        "/v1/locks/r/release",
        json!({"owner": "w", "token": token}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    for (path, t) in [
        ("/v1/fences/r/admit", token + 1),
        ("/v1/fences/fresh/admit", MAX),
    ] {
        invalid_token(&send(&base, Method::POST, path, json!({"token": t})).await);
    }
    invalid_token(
        &send(
            &base,
            Method::PUT,
            "/v1/kv/fresh",
            json!({"token": MAX, "value": 1}),
        )
        .await,
    );
    // A stale holder's token was issued: the fence, not the check, judges
    // it (the same token again passes; a lower one would be refused there).
    let (status, admitted) = send(
        &base,
        Method::POST,
        "/v1/fences/r/admit",
        json!({"token": token}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{admitted}");
    // The check left the key free for the next holder, above every token
    // before.
    let (status, next) = send(
        &base,
        Method::POST,
        "/v1/locks/r/acquire",
        json!({"owner": "w2", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert!(next["token"].as_u64().unwrap() > token, "{next}");
}

/// A fence blocked anyway (a fence of its own, shown every token) is
/// repaired by the admin: the reset forgets its tokens and its value, is
/// refused to clients, and is on the event stream.
#[tokio::test]
async fn only_an_admin_resets_a_fence_and_the_event_stream_says_so() {
    const ADMIN: &str = "admin-0123456789abcdef";
    const CLIENT: &str = "client-0123456789abcdef";
    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .tokens(
            fencelock_serve::Tokens::parse(&format!("admin {ADMIN}\nclient {CLIENT}\n")).unwrap(),
        )
        .build();
    let p = fencelock_testkit::Patience::measure().await;
    let (_server, base) = serve(service).await;
    let http = reqwest::Client::new();
    let call = |token: &'static str, method: Method, path: &'static str, body: Value| {
        let body = (!body.is_null()).then_some(body);
        support::send(&base, Some(token), method, path, body)
    };
    let mut events = http
        .get(format!("{base}/v1/events"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();

    for (path, body) in [
        ("/v1/fences/blocked/admit", json!({"token": MAX})),
        ("/v1/kv/blocked", json!({"token": MAX, "value": "x"})),
    ] {
        let method = if path.starts_with("/v1/kv") {
            Method::PUT
        } else {
            Method::POST
        };
        let (status, answer) = call(CLIENT, method, path, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    for path in ["/v1/fences/blocked", "/v1/kv/blocked"] {
        let (status, answer) = call(CLIENT, Method::DELETE, path, Value::Null).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden"))
        );
    }
    // The `http://` fence of a client says why: the token, not the service,
    // is refused (what the packages raise as their "unauthorized" error).
    let client_fence =
        fencelock_http::HttpFence::new(&base.replace("http://", &format!("http://:{CLIENT}@")))
            .unwrap();
    let refused = client_fence.reset("blocked").await.unwrap_err();
    assert_eq!(refused.code(), "unauthorized", "{refused}");
    assert!(refused.to_string().contains("403"), "{refused}");
    let (status, answer) = call(ADMIN, Method::DELETE, "/v1/kv/blocked", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["had"], MAX, "{answer}");
    let (_, fence) = call(CLIENT, Method::GET, "/v1/fences/blocked", Value::Null).await;
    assert_eq!(fence["current"], Value::Null, "{fence}");
    let (status, _) = call(CLIENT, Method::GET, "/v1/kv/blocked", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, answer) = call(
        CLIENT,
        Method::POST,
        "/v1/fences/blocked/admit",
        json!({"token": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let mut seen = String::new();
    tokio::time::timeout(p.bound(std::time::Duration::from_secs(10)), async {
        while !seen.contains("event: reset") {
            let chunk = events.chunk().await.unwrap().expect("the stream ended");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no reset on the event stream [{p}]: {seen}"));
    assert!(seen.contains(&format!("\"token\":{MAX}")), "{seen}");
}
