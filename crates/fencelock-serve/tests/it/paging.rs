//! Limits that protect the other clients (`docs/http.md`, "Threat model"):
//! an all-or-nothing acquisition takes a bounded number of keys, and the
//! listings come in pages.
//!
//! Time: the leases (30 s, in the service's own memory store) outlive the
//! test's few local requests by far and keep their figures; no wait or
//! bound.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;

use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
use fencelock_serve::{ServerHandle, Service};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, serve};

async fn start() -> (ServerHandle, String) {
    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .build();
    serve(service).await
}

async fn send(base: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    support::send(base, None, method, path, body).await
}

#[tokio::test]
async fn an_all_or_nothing_acquisition_takes_at_most_1000_keys() {
    let (_server, base) = start().await;
    let keys = |n: usize| (0..n).map(|i| format!("k{i:05}")).collect::<Vec<_>>();
    let (status, refused) = send(
        &base,
        Method::POST,
        "/v1/acquire",
        Some(json!({"keys": keys(1001), "owner": "w", "ttl_ms": 30000})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["code"], "bad_request");
    assert!(
        refused["error"].as_str().unwrap().contains("1000"),
        "{refused}"
    );
    // Nothing was taken.
    let (_, listed) = send(&base, Method::GET, "/v1/locks", None).await;
    assert_eq!(listed["locks"].as_array().unwrap().len(), 0, "{listed}");

    let (status, granted) = send(
        &base,
        Method::POST,
        "/v1/acquire",
        Some(json!({"keys": keys(1000), "owner": "w", "ttl_ms": 30000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(granted["grants"].as_array().unwrap().len(), 1000);
}

/// Follows `path` (with `limit` and `after`) page by page: every lease's
/// key, in order, each page at most `limit` leases or more only to finish
/// its last key.
async fn pages(base: &str, path: &str, table: &str, limit: usize) -> Vec<String> {
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{path}?limit={limit}");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let (status, page) = send(base, Method::GET, &url, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let rows: Vec<String> = page[table]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect();
        assert!(
            rows.len() <= limit || rows[limit - 1..].iter().all(|k| *k == rows[limit - 1]),
            "{page}"
        );
        keys.extend(rows);
        match &page["next"] {
            Value::Null => return keys,
            Value::String(next) => after = Some(next.clone()),
            other => panic!("next is {other}"),
        }
    }
}

#[tokio::test]
async fn the_lock_list_and_the_activity_leases_come_in_pages() {
    let (_server, base) = start().await;
    let all: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    for key in &all {
        let (status, _) = send(
            &base,
            Method::POST,
            &format!("/v1/locks/{key}/acquire"),
            Some(json!({"owner": "w", "ttl_ms": 30000})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(pages(&base, "/v1/locks", "locks", 10).await, all);
    assert_eq!(pages(&base, "/v1/activity", "leases", 7).await, all);
    // Without a limit, everything and no cursor, as before paging.
    let (_, whole) = send(&base, Method::GET, "/v1/locks", None).await;
    assert_eq!(whole["locks"].as_array().unwrap().len(), 25);
    assert!(whole.get("next").is_none(), "{whole}");
    for bad in ["limit=0", "limit=10001"] {
        let (status, refused) = send(&base, Method::GET, &format!("/v1/locks?{bad}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {refused}");
    }
}

/// A read-write lock's readers are one lease each under one key: a page
/// that ended between two of them would lose the rest, since the next page
/// starts after the key.
#[tokio::test]
async fn a_page_never_splits_the_readers_of_a_key() {
    let (_server, base) = start().await;
    let mut all = Vec::new();
    for (key, readers) in [("a", 1), ("r", 4), ("z", 1)] {
        for i in 0..readers {
            let (status, grant) = send(
                &base,
                Method::POST,
                &format!("/v1/locks/{key}/acquire"),
                Some(json!({"owner": format!("reader-{i}"), "ttl_ms": 30000, "mode": "shared"})),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{grant}");
            all.push(key.to_owned());
        }
    }
    for limit in 1..=3 {
        assert_eq!(
            pages(&base, "/v1/locks", "locks", limit).await,
            all,
            "limit {limit}"
        );
    }
}
