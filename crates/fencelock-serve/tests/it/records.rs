//! Records belong to their owner (`docs/http.md`, "Threat model"): a
//! renewal a stranger sends for someone else's live lease is refused and is
//! nobody's loss. The holder's record in `/v1/activity` and
//! `fencelock_locks_lost_total` change only for the lease's own client.
//!
//! Over SQLite, so that the `backend="sqlite"` series counts this module's
//! renewals only (the recorder is the process's; other modules use memory).
//!
//! Time: the lease (60 s, in a SQLite file of the test's own) outlives the
//! test's few local requests by far and keeps its figure; no wait or bound.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;

use fencelock_core::LockClient;
use fencelock_serve::{ServerHandle, Service, Tokens};
use fencelock_sqlite::{SqliteBackend, SqliteFence, SqliteOptions};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, serve};

const ADMIN: &str = "admin-0123456789abcdef";
const HOLDER: &str = "holder-0123456789abcdef";
const STRANGER: &str = "stranger-0123456789abcdef";
const LOST: &str = "fencelock_locks_lost_total{backend=\"sqlite\",reason=\"refused\"}";

struct Api {
    base: String,
    _server: ServerHandle,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions::new(dir.path().join("locks.db"));
        let backend = Arc::new(SqliteBackend::connect_with(options.clone()).await.unwrap());
        let fence = Arc::new(SqliteFence::connect_with(options).await.unwrap());
        let tokens = format!("admin {ADMIN}\nclient {HOLDER} app\nclient {STRANGER} other\n");
        let service = Service::builder(LockClient::new(backend))
            .fence(fence)
            .tokens(Tokens::parse(&tokens).unwrap())
            .build();
        let (server, base) = serve(service).await;
        Self {
            base,
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
        support::send(&self.base, Some(token), method, path, body).await
    }

    async fn lost(&self) -> f64 {
        let (_, text) = self.send(ADMIN, Method::GET, "/metrics", None).await;
        text.as_str()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(LOST))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// The holder's activity: its lease's note, the incidents, the losses.
    async fn activity(&self) -> (Value, Vec<Value>, u64) {
        let (_, seen) = self.send(HOLDER, Method::GET, "/v1/activity", None).await;
        let note = seen["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["key"] == "k")
            .cloned()
            .unwrap_or(Value::Null);
        let lost = seen["rates"]["lost"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        (note, seen["incidents"].as_array().unwrap().clone(), lost)
    }
}

#[tokio::test]
async fn a_strangers_refused_renewal_is_not_the_holders_loss() {
    let api = Api::start().await;
    let lost_before = api.lost().await;
    let (status, grant) = api
        .send(
            HOLDER,
            Method::POST,
            "/v1/locks/k/acquire",
            Some(json!({"owner": "w", "ttl_ms": 60000})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let token = grant["token"].as_u64().unwrap();

    // Another client names the holder's owner and token: its owner is put in
    // its own namespace, so the backend refuses. So does the admin naming
    // the right token with a wrong owner, one by one and in a batch.
    for _ in 0..10 {
        let (status, body) = api
            .send(
                STRANGER,
                Method::POST,
                "/v1/locks/k/renew",
                Some(json!({"owner": "w", "token": token})),
            )
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::CONFLICT, Some("not_held"))
        );
    }
    let (status, body) = api
        .send(
            ADMIN,
            Method::POST,
            "/v1/locks/k/renew",
            Some(json!({"owner": "app/x", "token": token})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = api
        .send(
            STRANGER,
            Method::POST,
            "/v1/renew",
            Some(json!({"leases": [{"key": "k", "owner": "w", "token": token}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"][0]["status"], 409, "{body}");

    let (note, incidents, lost) = api.activity().await;
    assert_eq!(
        note["token"], token,
        "the holder's lease lost its note: {note}"
    );
    assert_eq!(note["renewal_failures"], 0, "{note}");
    assert!(incidents.is_empty(), "{incidents:?}");
    assert_eq!(lost, 0);
    assert_eq!(
        api.lost().await,
        lost_before,
        "a stranger's refusal counted as a loss"
    );

    // The holder renews as before.
    let (status, body) = api
        .send(
            HOLDER,
            Method::POST,
            "/v1/locks/k/renew",
            Some(json!({"owner": "w", "token": token})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A real loss still counts: force-released, the holder's renewal is
    // refused.
    let (status, _) = api.send(ADMIN, Method::DELETE, "/v1/locks/k", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api
        .send(
            HOLDER,
            Method::POST,
            "/v1/locks/k/renew",
            Some(json!({"owner": "w", "token": token})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (note, incidents, lost) = api.activity().await;
    assert_eq!(note, Value::Null);
    assert_eq!(incidents[0]["type"], "renewal_refused", "{incidents:?}");
    assert_eq!(incidents[0]["owner"], "w");
    assert_eq!(lost, 2, "the force-release and the refusal");
    assert_eq!(api.lost().await, lost_before + 1.0);
}
