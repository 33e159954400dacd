//! What the client adds on top of a backend, measured on the in-process
//! memory backend so that no server takes part: acquire+release through
//! `LockClient` (with and without renewal), dropping a guard
//! (background release), and one renewal through a guard. A regression in
//! the client shows here without a server.
//!
//! ```text
//! cargo bench -p fencelock-core --bench client
//! ```

use std::{sync::Arc, time::Duration};

use criterion::{criterion_main, Criterion};
use fencelock_core::{Acquire, AcquireRequest, Backend, LockClient, LockKey, MemoryBackend, Owner};

const TTL: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    // The CLI's runtime: two workers.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

fn acquire_release(c: &mut Criterion) {
    let rt = runtime();
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let client = LockClient::new(Arc::clone(&backend));
    let mut group = c.benchmark_group("acquire_release");
    group.bench_function("backend_only", |b| {
        let request = AcquireRequest::new(
            LockKey::new("bench-backend").unwrap_or_else(|e| panic!("{e}")),
            Owner::new("bench").unwrap_or_else(|e| panic!("{e}")),
            TTL,
        );
        b.to_async(&rt).iter(|| async {
            match backend.try_acquire(&request).await {
                Ok(Acquire::Granted(g)) => {
                    let lease = request.lease(g.token);
                    assert!(matches!(backend.release(&lease).await, Ok(())));
                }
                other => panic!("own key not granted: {other:?}"),
            }
        });
    });
    for auto_renew in [true, false] {
        let name = if auto_renew {
            "client"
        } else {
            "client_no_renewal"
        };
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let guard = client
                    .lock("bench-client")
                    .ttl(TTL)
                    .auto_renew(auto_renew)
                    .try_acquire()
                    .await;
                match guard {
                    Ok(Some(guard)) => assert!(guard.release().await.is_ok()),
                    other => panic!("own key not granted: {other:?}"),
                }
            });
        });
    }
    group.finish();
}

fn guard_drop(c: &mut Criterion) {
    let rt = runtime();
    let client = LockClient::new(Arc::new(MemoryBackend::new()));
    let mut n = 0u64;
    c.bench_function("guard_drop", |b| {
        b.to_async(&rt).iter(|| {
            // A key per iteration: the background release of the previous
            // guard may not have run yet.
            n += 1;
            let key = format!("bench-drop-{n}");
            let client = client.clone();
            async move {
                match client.lock(key).ttl(TTL).try_acquire().await {
                    Ok(Some(guard)) => drop(guard),
                    other => panic!("free key not granted: {other:?}"),
                }
            }
        });
    });
}

fn renewal(c: &mut Criterion) {
    let rt = runtime();
    let client = LockClient::new(Arc::new(MemoryBackend::new()));
    let guard = rt
        .block_on(client.lock("bench-renew").ttl(TTL).acquire())
        .unwrap_or_else(|e| panic!("{e}"));
    c.bench_function("renew", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(guard.renew().await.is_ok()) });
    });
    rt.block_on(async { assert!(guard.release().await.is_ok()) });
}

// The macro defines an undocumented `pub fn benches`.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(
        benches,
        super::acquire_release,
        super::guard_drop,
        super::renewal
    );
}
criterion_main!(group::benches);
