//! `GET /metrics`: the library's metrics in Prometheus text, and gauges
//! computed from the backend at scrape time (`docs/observability.md`).

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Mutex, OnceLock, PoisonError},
};

use axum::{extract::State, http::header, response::IntoResponse};
use metrics::{describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::{api::OP_TIMEOUT, error::ApiError, Service};

/// Gauge: unexpired leases on the backend, by `kind` (`""` for none; at
/// most [`crate::ServiceBuilder::max_kinds`] kinds, the rest as `other`).
pub const BACKEND_HELD: &str = "fencelock_backend_held";
/// The `kind` label of the leases of kinds past the bound.
pub const OTHER_KIND: &str = "other";
/// How many kinds get a `fencelock_backend_held` series of their own by
/// default.
pub const DEFAULT_MAX_KINDS: usize = 100;
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

/// The kinds that have a `fencelock_backend_held` series of their own: a
/// kind keeps its place while it has leases, and a kind first seen while
/// all places are taken is counted under [`OTHER_KIND`], so the series do
/// not change from scrape to scrape with the counts.
#[derive(Debug, Default)]
pub(crate) struct Kinds {
    own: Mutex<HashSet<String>>,
}

impl Kinds {
    /// The series of `held` (leases by kind) within `max` kinds of their
    /// own, sorted by kind, with the rest summed under [`OTHER_KIND`].
    fn series(&self, held: &BTreeMap<String, u64>, max: usize) -> Vec<(String, u64)> {
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        // Kinds no longer held give their place up (and their series go).
        own.retain(|kind| held.contains_key(kind));
        let mut series = Vec::new();
        let mut other = 0;
        for (kind, &n) in held {
            // A kind named like the bucket is counted in it: one series.
            let placed = kind != OTHER_KIND
                && (own.contains(kind) || (own.len() < max && own.insert(kind.clone())));
            if placed {
                series.push((kind.clone(), n));
            } else {
                other += n;
            }
        }
        if other > 0 {
            series.push((OTHER_KIND.to_owned(), other));
        }
        series
    }
}

/// A Prometheus label value: `\`, `"` and line feeds escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `fencelock_backend_held` in Prometheus text, rendered at each scrape
/// rather than kept in the recorder, so that a kind's series goes with its
/// last lease instead of staying at 0 for the life of the process.
fn held_text(backend: &str, series: &[(String, u64)]) -> String {
    use std::fmt::Write;
    let mut text = format!(
        "# HELP {BACKEND_HELD} Unexpired leases on the backend, by kind (at most a bounded number of kinds, the rest as \"{OTHER_KIND}\"), at scrape time.\n# TYPE {BACKEND_HELD} gauge\n"
    );
    for (kind, n) in series {
        let _ = writeln!(
            text,
            "{BACKEND_HELD}{{backend=\"{}\",kind=\"{}\"}} {n}",
            label(backend),
            label(kind)
        );
    }
    text
}

pub(crate) async fn scrape(State(s): State<Service>) -> Result<impl IntoResponse, ApiError> {
    let backend = s.inner.client.backend();
    let name = backend.name();
    gauge!(SERVICE_WAITERS, "backend" => name).set(s.inner.activity.waiters() as f64);
    let mut held = String::new();
    match tokio::time::timeout(OP_TIMEOUT, async { backend.administer()?.stats().await }).await {
        Ok(Ok(stats)) => {
            gauge!(BACKEND_UP, "backend" => name).set(1.0);
            let held_by_kind: BTreeMap<String, u64> = stats.held_by_kind.into_iter().collect();
            let series = s.inner.kinds.series(&held_by_kind, s.inner.max_kinds);
            held = held_text(name, &series);
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
    let mut text = s.inner.metrics.render();
    text.push_str(&held);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_past_the_bound_are_other_and_a_kind_keeps_its_place_while_held() {
        let kinds = Kinds::default();
        let held = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
            pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
        };
        let first = kinds.series(&held(&[("a", 1), ("b", 2), ("c", 3)]), 2);
        assert_eq!(
            first,
            [
                ("a".to_owned(), 1),
                ("b".to_owned(), 2),
                ("other".to_owned(), 3)
            ]
        );
        // "a" went away: its place goes to the next kind seen.
        let second = kinds.series(&held(&[("b", 2), ("c", 3), ("d", 4)]), 2);
        assert_eq!(
            second,
            [
                ("b".to_owned(), 2),
                ("c".to_owned(), 3),
                ("other".to_owned(), 4)
            ]
        );
        let named_other = kinds.series(&held(&[("other", 1), ("z", 1)]), 5);
        assert_eq!(named_other, [("z".to_owned(), 1), ("other".to_owned(), 1)]);
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
