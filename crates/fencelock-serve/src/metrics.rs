//! `GET /metrics`: the library's metrics in Prometheus text, and gauges
//! computed from the backend at scrape time (`docs/observability.md`).

use std::sync::{Mutex, OnceLock, PoisonError};

use axum::{extract::State, http::header, response::IntoResponse};
use metrics::{describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::{api::OP_TIMEOUT, error::ApiError, Service};

/// Gauge: unexpired leases on the backend, by `kind` (`""` for none).
pub const BACKEND_HELD: &str = "fencelock_backend_held";
/// Gauge: acquisitions long-polling through the service.
pub const SERVICE_WAITERS: &str = "fencelock_service_waiters";
/// Gauge: expired leases still stored on the backend.
pub const BACKEND_EXPIRED_NOT_CLEANED: &str = "fencelock_backend_expired_not_cleaned";
/// Gauge: age of the longest-held current lease, in seconds.
pub const BACKEND_OLDEST_HOLD_SECONDS: &str = "fencelock_backend_oldest_hold_seconds";
/// Gauge: 1 when the last scrape could read the backend, else 0.
pub const BACKEND_UP: &str = "fencelock_backend_up";
/// Counter: reads of the backend made to find changes for `/v1/events`, by
/// `source`: `listing` (a whole listing), `notice` (a key named by the
/// backend's change notices), `expiry` (a key whose known lease should have
/// ended).
pub const SERVICE_EVENT_READS: &str = "fencelock_service_event_reads_total";

/// The process's Prometheus handle: installs the recorder on first use. If
/// the process has another recorder already, the handle renders only what
/// is recorded into it (nothing of the library's metrics).
pub(crate) fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    fencelock_core::metrics::describe();
                    describe();
                }
                Err(_) => tracing::warn!(
                    "a metrics recorder is installed already; /metrics shows only the scrape-time gauges"
                ),
            }
            handle
        })
        .clone()
}

fn describe() {
    describe_gauge!(
        BACKEND_HELD,
        Unit::Count,
        "Unexpired leases on the backend, by kind, at scrape time."
    );
    describe_gauge!(
        SERVICE_WAITERS,
        Unit::Count,
        "Acquisitions long-polling through this service, at scrape time."
    );
    describe_gauge!(
        BACKEND_EXPIRED_NOT_CLEANED,
        Unit::Count,
        "Expired leases still stored on the backend (what cleanup would delete)."
    );
    describe_gauge!(
        BACKEND_OLDEST_HOLD_SECONDS,
        Unit::Seconds,
        "How long the longest-held current lease has been held, at scrape time."
    );
    describe_gauge!(
        BACKEND_UP,
        Unit::Count,
        "1 when the last scrape could read the backend's statistics, else 0."
    );
    describe_counter!(
        SERVICE_EVENT_READS,
        Unit::Count,
        "Reads of the backend made to find changes for /v1/events, by source: listing (the whole backend), notice (a key the backend's change notices named), expiry (a key whose known lease should have ended)."
    );
}

/// Kinds reported by an earlier scrape: set to 0 when they have no lease
/// left, rather than repeating their last count.
static KINDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(crate) async fn scrape(State(s): State<Service>) -> Result<impl IntoResponse, ApiError> {
    let backend = s.inner.client.backend();
    let name = backend.name();
    gauge!(SERVICE_WAITERS, "backend" => name).set(s.inner.activity.waiters() as f64);
    match tokio::time::timeout(OP_TIMEOUT, backend.stats()).await {
        Ok(Ok(stats)) => {
            gauge!(BACKEND_UP, "backend" => name).set(1.0);
            let mut kinds = KINDS.lock().unwrap_or_else(PoisonError::into_inner);
            for kind in kinds.iter() {
                if !stats.held_by_kind.contains_key(kind) {
                    gauge!(BACKEND_HELD, "backend" => name, "kind" => kind.clone()).set(0.0);
                }
            }
            for (kind, n) in &stats.held_by_kind {
                gauge!(BACKEND_HELD, "backend" => name, "kind" => kind.clone()).set(*n as f64);
                if !kinds.contains(kind) {
                    kinds.push(kind.clone());
                }
            }
            gauge!(BACKEND_EXPIRED_NOT_CLEANED, "backend" => name)
                .set(stats.expired_not_cleaned as f64);
            gauge!(BACKEND_OLDEST_HOLD_SECONDS, "backend" => name)
                .set(stats.max_hold_seconds.unwrap_or(0.0));
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "stats for /metrics failed");
            gauge!(BACKEND_UP, "backend" => name).set(0.0);
        }
        Err(_) => gauge!(BACKEND_UP, "backend" => name).set(0.0),
    }
    s.inner.metrics.run_upkeep();
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.inner.metrics.render(),
    ))
}
