//! What the modules that drive a service over HTTP share: the service on a
//! free loopback port, and one request with its answer.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use fencelock_serve::{Server, ServerHandle, Service};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// `service` served on a free loopback port: its handle (the server stops
/// when it is dropped) and its base URL.
pub async fn serve(service: Service) -> (ServerHandle, String) {
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    (server.spawn(), base)
}

/// Sends `body` (if any) to `base` + `path`, with `token` as the bearer
/// (if any); the status, and the answer's JSON (or its text as a JSON
/// string, for the answers that are not JSON).
pub async fn send(
    base: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
