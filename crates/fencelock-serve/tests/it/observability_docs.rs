//! `docs/grafana/fencelock.json` and `docs/prometheus/alerts.yml` parse, and
//! every metric they query is one the library documents or the service's
//! `/metrics` exports (with its HELP text), so that a renamed metric
//! cannot leave a dashboard panel or an alert silently empty.
//!
//! Time: the lease (10 s, in the service's own memory store) only has to
//! exist when `/metrics` is read right after; no wait or bound.

use std::{collections::BTreeMap, collections::BTreeSet, path::PathBuf, sync::Arc};

use fencelock_core::{metrics, LockClient, MemoryBackend};
use fencelock_serve::{Server, Service};
use fencelock_testkit::TestResult;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

fn docs(path: &str) -> TestResult<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(path);
    Ok(std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// The metric names in a PromQL expression: every `fencelock_…` word, with
/// the `_sum`/`_count`/`_bucket` series of a summary or histogram mapped to
/// the metric's own name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("fencelock_") {
        let word: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[start + word.len()..];
        let name = ["_sum", "_count", "_bucket"]
            .iter()
            .find_map(|suffix| word.strip_suffix(suffix))
            .unwrap_or(&word);
        names.insert(name.to_owned());
    }
    names
}

/// The metrics `/metrics` describes (`# HELP name …`) while a lock is held
/// through the service, plus every name the library documents.
async fn known_metrics() -> TestResult<BTreeSet<String>> {
    let client = LockClient::new(Arc::new(MemoryBackend::new()));
    let server = Server::bind("127.0.0.1:0".parse()?, Service::builder(client).build())
        .await?
        .spawn();
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.local_addr());
    let grant = http
        .post(format!("{base}/v1/locks/docs/acquire"))
        .json(&serde_json::json!({"ttl_ms": 10_000, "kind": "docs"}))
        .send()
        .await?;
    assert_eq!(grant.status(), StatusCode::OK);
    let grant: Value = grant.json().await?;
    let scrape = http.get(format!("{base}/metrics")).send().await?;
    assert_eq!(scrape.status(), StatusCode::OK);
    let text = scrape.text().await?;
    let released = http
        .post(format!("{base}/v1/locks/docs/release"))
        .json(&serde_json::json!({"owner": grant["owner"], "token": grant["token"]}))
        .send()
        .await?;
    assert_eq!(released.status(), StatusCode::OK);
    server.shutdown().await;

    let mut known: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# HELP "))
        .filter_map(|help| help.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        known.contains("fencelock_backend_held"),
        "the scrape-time gauges are described: {known:?}"
    );
    known.extend(
        [
            metrics::ACQUIRE_ATTEMPTS,
            metrics::ACQUIRE_SUCCESSES,
            metrics::ACQUIRE_TIMEOUTS,
            metrics::WAIT_SECONDS,
            metrics::HOLD_SECONDS,
            metrics::RENEWALS,
            metrics::RENEW_SECONDS,
            metrics::RENEWAL_FAILURES,
            metrics::LOCKS_LOST,
            metrics::FENCE_REJECTIONS,
            metrics::HELD,
        ]
        .map(str::to_owned),
    );
    Ok(known)
}

fn check_names(what: &str, expr: &str, known: &BTreeSet<String>) -> usize {
    let names = metric_names(expr);
    for name in &names {
        assert!(
            known.contains(name),
            "{what} queries {name}, which nothing exports: {expr}"
        );
    }
    names.len()
}

#[tokio::test]
async fn grafana_dashboard_queries_exported_metrics() -> TestResult {
    let dashboard: Value = serde_json::from_str(&docs("grafana/fencelock.json")?)?;
    let known = known_metrics().await?;
    let panels = dashboard["panels"].as_array().ok_or("panels is an array")?;
    let mut queried = BTreeSet::new();
    let mut targets = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().ok_or("every panel has a title")?;
        let exprs = panel["targets"]
            .as_array()
            .ok_or_else(|| format!("panel {title} has targets"))?;
        assert!(!exprs.is_empty(), "panel {title} queries nothing");
        for target in exprs {
            let expr = target["expr"]
                .as_str()
                .ok_or_else(|| format!("panel {title}: a target without expr"))?;
            assert!(
                check_names(&format!("panel {title}"), expr, &known) > 0,
                "panel {title} queries no fencelock metric: {expr}"
            );
            queried.extend(metric_names(expr));
            targets += 1;
        }
    }
    assert!(targets > 0);
    // Every metric the library documents has a panel.
    for name in [
        metrics::ACQUIRE_ATTEMPTS,
        metrics::ACQUIRE_SUCCESSES,
        metrics::ACQUIRE_TIMEOUTS,
        metrics::WAIT_SECONDS,
        metrics::HOLD_SECONDS,
        metrics::RENEWALS,
        metrics::RENEW_SECONDS,
        metrics::RENEWAL_FAILURES,
        metrics::LOCKS_LOST,
        metrics::FENCE_REJECTIONS,
        metrics::HELD,
    ] {
        assert!(queried.contains(name), "no panel shows {name}");
    }
    Ok(())
}

/// A Prometheus rule file, as far as these rules use it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[tokio::test]
async fn alert_rules_parse_and_query_exported_metrics() -> TestResult {
    let rules: RuleFile = serde_norway::from_str(&docs("prometheus/alerts.yml")?)?;
    let known = known_metrics().await?;
    let mut alerts = BTreeSet::new();
    for group in &rules.groups {
        assert!(!group.name.is_empty());
        for rule in &group.rules {
            assert!(alerts.insert(rule.alert.clone()), "{} twice", rule.alert);
            check_names(&rule.alert, &rule.expr, &known);
            assert!(
                !metric_names(&rule.expr).is_empty(),
                "{} queries no fencelock metric",
                rule.alert
            );
            if let Some(duration) = &rule.for_ {
                humantime::parse_duration(duration)
                    .map_err(|e| format!("{}: for {duration:?}: {e}", rule.alert))?;
            }
            let severity = rule.labels.get("severity").map(String::as_str);
            assert!(
                matches!(severity, Some("info" | "warning" | "critical")),
                "{}: severity {severity:?}",
                rule.alert
            );
            for annotation in ["summary", "description"] {
                assert!(
                    rule.annotations.contains_key(annotation),
                    "{} has no {annotation}",
                    rule.alert
                );
            }
        }
    }
    // The three the operators asked for.
    for needed in [
        "FencelockLockHeldTooLong",
        "FencelockRenewalFailures",
        "FencelockLocksLost",
    ] {
        assert!(alerts.contains(needed), "{needed} is missing");
    }
    Ok(())
}

#[test]
fn metric_names_are_read_from_expressions() {
    let names = metric_names(
        r#"sum(rate(fencelock_wait_seconds_sum{job="x"}[5m])) / sum(rate(fencelock_wait_seconds_count[5m])) > fencelock_held"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["fencelock_held", "fencelock_wait_seconds"]
    );
}
