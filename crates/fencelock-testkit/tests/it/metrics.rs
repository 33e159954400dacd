//! The documented metrics are recorded under their documented names.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{collections::HashMap, sync::Arc, time::Duration};

use fencelock_core::{
    metrics as m, BackendAdmin, Fence, FencingToken, LockClient, LockKey, MemoryBackend,
    MemoryFence,
};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn lifecycle_records_every_documented_metric() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    // Clients describe the metrics once per process, to whichever recorder
    // is installed then; this test's recorder is local to it, so it asks
    // again.
    m::describe();

    let memory = Arc::new(MemoryBackend::new());
    let client = LockClient::new(memory.clone());
    let guard = client
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // A waiter that times out.
    assert!(client
        .lock("k")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(11)).await; // one renewal
    memory
        .force_release(&LockKey::new("k").unwrap())
        .await
        .unwrap();
    guard.lost().await; // refused at the next renewal
    drop(guard);
    let fence = MemoryFence::new();
    fence.admit("r", FencingToken(2)).await.unwrap();
    assert!(fence.admit("r", FencingToken(1)).await.is_err());

    let mut seen: HashMap<String, f64> = HashMap::new();
    for (key, unit, help, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name();
        // Exported with HELP text, under the kind it is recorded as.
        assert!(
            help.is_some_and(|h| !h.is_empty()),
            "{name} has no description"
        );
        let (v, expected_unit) = match value {
            DebugValue::Counter(c) => (c as f64, Unit::Count),
            DebugValue::Gauge(g) => (g.into_inner(), Unit::Count),
            DebugValue::Histogram(h) => (h.len() as f64, Unit::Seconds),
        };
        assert_eq!(unit, Some(expected_unit), "{name}");
        *seen.entry(key.key().name().to_owned()).or_default() += v;
    }
    let expect = [
        (m::ACQUIRE_ATTEMPTS, 1.0),
        (m::ACQUIRE_SUCCESSES, 1.0),
        (m::ACQUIRE_TIMEOUTS, 1.0),
        (m::WAIT_SECONDS, 1.0),
        (m::HOLD_SECONDS, 1.0),
        (m::RENEWALS, 1.0),
        (m::RENEWAL_FAILURES, 1.0),
        (m::LOCKS_LOST, 1.0),
        (m::FENCE_REJECTIONS, 1.0),
    ];
    for (name, at_least) in expect {
        let got = seen.get(name).copied().unwrap_or(0.0);
        assert!(got >= at_least, "{name}: {got} (all: {seen:?})");
    }
    // Every guard that was counted in was counted out.
    assert_eq!(seen.get(m::HELD).copied(), Some(0.0));
}
