//! Bounded metrics (`docs/observability.md`, "Cardinality"): the `kind`
//! label of `fencelock_backend_held` takes at most the configured number of
//! values, the rest counted as `other`, and a kind's series goes with its
//! last lease.
//!
//! Time: the leases (60 s, in the service's own memory store) outlive the
//! test's local requests by far and keep their figures; no wait or bound.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;

use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
use fencelock_serve::Service;
use serde_json::json;

use crate::support::serve;

#[tokio::test]
async fn kinds_past_the_bound_are_counted_as_other_and_series_go_with_their_leases() {
    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .max_kinds(3)
        .build();
    let (_server, base) = serve(service).await;
    let http = reqwest::Client::new();
    let held = || async {
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            text.contains("# TYPE fencelock_backend_held gauge"),
            "{text}"
        );
        let mut series: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("fencelock_backend_held{backend=\"memory\",kind=\""))
            .map(|l| {
                let (kind, value) = l.split_once("\"} ").unwrap();
                (kind.to_owned(), value.parse().unwrap())
            })
            .collect();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        series
    };
    let mut tokens = Vec::new();
    for i in 0..6 {
        let grant: serde_json::Value = http
            .post(format!("{base}/v1/locks/k{i}/acquire"))
            .json(&json!({"owner": "w", "ttl_ms": 60000, "kind": format!("kind-{}", i.min(4))}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        tokens.push(grant["token"].as_u64().unwrap());
    }
    let series = held().await;
    assert_eq!(series.len(), 4, "three kinds and other: {series:?}");
    assert_eq!(series.iter().map(|s| s.1).sum::<f64>(), 6.0, "{series:?}");
    assert_eq!(
        series.last().unwrap(),
        &("other".to_owned(), series.last().unwrap().1)
    );

    for (i, token) in tokens.iter().enumerate() {
        let released = http
            .post(format!("{base}/v1/locks/k{i}/release"))
            .json(&json!({"owner": "w", "token": token}))
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), 200);
    }
    let series = held().await;
    assert!(
        series.is_empty(),
        "series outlived their leases: {series:?}"
    );
}
