//! `fencelock scorecard`, short: the two shapes whose failover is the
//! client's own (service replicas named by every address, and a Redlock
//! set), each component killed, stopped, and killed and started again at
//! once (a Redlock node without its data). A single failed component of a
//! healthy majority must cost no holder its lock and fail no caller whose
//! wait covers the failover; every waiter's token is above its holder's.
//! The other shapes run in `fencelock scorecard` itself (docs/faults.md).

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

#[test]
fn one_failed_replica_or_node_costs_patient_clients_nothing() {
    let out = Command::new(BIN)
        .args([
            "--json",
            "scorecard",
            "--shapes",
            "replicas,redlock",
            "--faults",
            "kill,stop,restart",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scorecard failed: {stderr}");
    let cases: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cases.len(), 6, "{cases:?}");
    for case in &cases {
        let what = format!("{} / {}", case["shape"], case["fault"]);
        assert_eq!(case["unnecessary_losses"], 0, "{what}: {case}");
        assert_eq!(case["failed_calls"], 0, "{what}: {case}");
        assert_eq!(case["token_regressions"], 0, "{what}: {case}");
        assert!(
            case["recovery_ms"].is_u64(),
            "{what}: no new caller was granted after the fault: {case}"
        );
    }
}
