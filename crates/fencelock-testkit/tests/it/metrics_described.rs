//! Building a client describes the metrics to the recorder installed then,
//! without the application asking. Its own test binary: the description is
//! made once per process, by the first client built.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;

use fencelock_core::{metrics as m, LockClient, MemoryBackend};
use metrics_util::debugging::DebuggingRecorder;

#[tokio::test(flavor = "current_thread")]
async fn the_first_client_describes_the_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let client = LockClient::new(Arc::new(MemoryBackend::new()));
    client
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let snapshot = snapshotter.snapshot().into_vec();
    let described = |name: &str| {
        snapshot
            .iter()
            .any(|(key, _, help, _)| key.key().name() == name && help.is_some())
    };
    for name in [
        m::ACQUIRE_ATTEMPTS,
        m::WAIT_SECONDS,
        m::HOLD_SECONDS,
        m::HELD,
    ] {
        assert!(described(name), "{name} was recorded without a description");
    }
}
