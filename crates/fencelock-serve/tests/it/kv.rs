//! The fenced key-value store (`/v1/kv`) keeps its values in the backend's
//! fence, not in the service: they outlive a restart of the service, every
//! service over the same backend sees the same ones, and limits are 400s.
//! Real services on loopback ports over one SQLite file, and over a
//! throwaway Redis for the admin's reset.
//!
//! Time: nothing here depends on elapsed time: no lease, wait or bound.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{net::SocketAddr, path::Path, sync::Arc};

use fencelock_core::{Fence, FencedValue, FencingToken, LockClient, MAX_FENCED_VALUE};
use fencelock_redis::{RedisBackend, RedisFence};
use fencelock_serve::{Server, ServerHandle, Service};
use fencelock_sqlite::{SqliteBackend, SqliteFence, SqliteOptions};
use fencelock_testkit::{servers::redis::RedisServer, TestResult};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support;

/// A service over the SQLite file `db`, on `addr` (port 0: any).
async fn serve(db: &Path, addr: SocketAddr) -> (ServerHandle, String) {
    let options = SqliteOptions::new(db);
    let backend = Arc::new(SqliteBackend::connect_with(options.clone()).await.unwrap());
    let fence = Arc::new(SqliteFence::connect_with(options).await.unwrap());
    let service = Service::builder(LockClient::new(backend))
        .fence(fence)
        .build();
    let server = Server::bind(addr, service).await.unwrap();
    let base = format!("http://{}", server.local_addr());
    (server.spawn(), base)
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn send(base: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut r = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(body) = body {
        r = r.json(&body);
    }
    let response = r.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

async fn put(base: &str, key: &str, token: u64, value: Value) -> (StatusCode, Value) {
    send(
        base,
        Method::PUT,
        &format!("/v1/kv/{key}"),
        Some(json!({"token": token, "value": value})),
    )
    .await
}

async fn get(base: &str, key: &str) -> (StatusCode, Value) {
    send(base, Method::GET, &format!("/v1/kv/{key}"), None).await
}

#[tokio::test]
async fn values_survive_a_restart_of_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let (first, base) = serve(&db, any_port()).await;
    let (status, body) = put(&base, "ledger", 7, json!({"balance": 12})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    first.shutdown().await;

    let (_second, base) = serve(&db, any_port()).await;
    assert_eq!(
        get(&base, "ledger").await,
        (
            StatusCode::OK,
            json!({"key": "ledger", "token": 7, "value": {"balance": 12}})
        )
    );
    // The fence remembers the token too: the old writer stays refused.
    let (status, body) = put(&base, "ledger", 6, json!({"balance": 0})).await;
    assert_eq!(
        (status, &body["code"], &body["current"]),
        (StatusCode::CONFLICT, &json!("stale"), &json!(7)),
        "{body}"
    );
}

#[tokio::test]
async fn two_services_over_one_backend_see_the_same_values() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let (_a, a) = serve(&db, any_port()).await;
    let (_b, b) = serve(&db, any_port()).await;
    assert_eq!(
        put(&a, "ledger", 5, json!("from a")).await.0,
        StatusCode::OK
    );
    assert_eq!(get(&b, "ledger").await.1["value"], "from a");
    assert_eq!(
        put(&b, "ledger", 8, json!("from b")).await.0,
        StatusCode::OK
    );
    let (status, body) = put(&a, "ledger", 6, json!("late a")).await;
    assert_eq!(
        (status, &body["current"]),
        (StatusCode::CONFLICT, &json!(8)),
        "{body}"
    );
    for base in [&a, &b] {
        assert_eq!(
            get(base, "ledger").await,
            (
                StatusCode::OK,
                json!({"key": "ledger", "token": 8, "value": "from b"})
            )
        );
    }
}

#[tokio::test]
async fn limits_are_400s_with_a_clear_code() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(&dir.path().join("locks.db"), any_port()).await;
    // Serialized, a string of the limit less its two quotes is the limit.
    let largest = json!("x".repeat(MAX_FENCED_VALUE - 2));
    assert_eq!(
        put(&base, "big", 1, largest.clone()).await.0,
        StatusCode::OK
    );
    assert_eq!(get(&base, "big").await.1["value"], largest);
    let over = json!("x".repeat(MAX_FENCED_VALUE - 1));
    let (status, body) = put(&base, "big", 2, over).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &json!("value_too_large")),
        "{body}"
    );
    assert!(body["error"].as_str().unwrap().contains("65536"), "{body}");
    // Nothing of the refused write was kept, not even its token.
    let (_, fence) = send(&base, Method::GET, "/v1/fences/big", None).await;
    assert_eq!(fence["current"], 1);

    let long = "k".repeat(256);
    for key in [long.as_str(), "a%01b"] {
        let (status, body) = put(&base, key, 1, json!(1)).await;
        assert_eq!(
            (status, &body["code"]),
            (StatusCode::BAD_REQUEST, &json!("invalid_key")),
            "{key}: {body}"
        );
        let (status, body) = get(&base, key).await;
        assert_eq!(
            (status, &body["code"]),
            (StatusCode::BAD_REQUEST, &json!("invalid_key")),
            "{key}: {body}"
        );
    }
}

/// An admin's reset (`DELETE /v1/kv/{key}`) through the service at `base`
/// forgets the value and the fence's tokens in its store: a lower token
/// writes again (as `cfg` = 1); a resource never fenced had nothing.
async fn reset_forgets_the_value_and_the_fence(base: &str) {
    let (status, _) = put(base, "cfg", 50, json!({"v": 1})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, reset) = send(base, Method::DELETE, "/v1/kv/cfg", None).await;
    assert_eq!(status, StatusCode::OK, "{reset}");
    assert_eq!(reset["had"], 50, "{reset}");
    assert_eq!(get(base, "cfg").await.0, StatusCode::NOT_FOUND);
    let (_, fence) = send(base, Method::GET, "/v1/fences/cfg", None).await;
    assert_eq!(fence["current"], Value::Null, "{fence}");
    let (status, written) = put(base, "cfg", 1, json!({"v": 2})).await;
    assert_eq!(status, StatusCode::OK, "{written}");
    // Nothing to forget: `had` is null.
    let (status, reset) = send(base, Method::DELETE, "/v1/fences/none", None).await;
    assert_eq!(
        (status, &reset["had"]),
        (StatusCode::OK, &Value::Null),
        "{reset}"
    );
}

#[tokio::test]
async fn a_reset_forgets_the_value_and_the_fence_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(&dir.path().join("locks.db"), any_port()).await;
    reset_forgets_the_value_and_the_fence(&base).await;
}

/// The same over Redis, whose fence resets with a script: the store itself
/// (read by a fence of its own) holds only what was written after the
/// reset.
#[tokio::test]
async fn a_reset_forgets_the_value_and_the_fence_in_redis() -> TestResult {
    let redis = RedisServer::start()?;
    let backend = Arc::new(RedisBackend::connect(&redis.url()).await?);
    let fence = Arc::new(RedisFence::connect(&redis.url()).await?);
    let service = Service::builder(LockClient::new(backend))
        .fence(fence)
        .build();
    let (_server, base) = support::serve(service).await;
    reset_forgets_the_value_and_the_fence(&base).await;
    let direct = RedisFence::connect(&redis.url()).await?;
    assert_eq!(direct.highest("cfg").await?, Some(FencingToken(1)));
    assert_eq!(
        direct.read_value("cfg").await?,
        Some(FencedValue::new(FencingToken(1), br#"{"v":2}"#.to_vec()))
    );
    Ok(())
}
