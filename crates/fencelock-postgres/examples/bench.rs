//! Throughput and hand-off latency against a throwaway durable server.
//! `cargo run --release -p fencelock-postgres --example bench`
//! Prints figures; asserts nothing.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockClient, LockKey, Owner};
use fencelock_testkit::{
    servers::postgres::{Durability, PostgresServer},
    TestResult,
};

const CYCLES: usize = 2000;
const HANDOFFS: usize = 300;

async fn cycles(backends: &[Arc<dyn Backend>]) -> TestResult<f64> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, backend) in backends.iter().enumerate() {
        let backend = Arc::clone(backend);
        tasks.push(tokio::spawn(async move {
            let req = AcquireRequest {
                key: LockKey::new(format!("bench-{i}"))?,
                owner: Owner::new(format!("client-{i}"))?,
                ttl: Duration::from_secs(30),
                kind: None,
                data: None,
            };
            for _ in 0..CYCLES / 8 {
                if let Acquire::Granted(g) = backend.try_acquire(&req).await? {
                    backend.release(&req.key, &req.owner, g.token).await?;
                }
            }
            Ok::<_, fencelock_core::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((CYCLES / 8 * backends.len()) as f64 / started.elapsed().as_secs_f64())
}

/// One holder releases; a waiter blocked on the key measures how long after
/// the release call returned it held the lock.
async fn handoff(url: &str) -> TestResult<(Duration, Duration)> {
    let a = LockClient::new(fencelock_postgres::open_backend(url).await?);
    let b = LockClient::new(fencelock_postgres::open_backend(url).await?);
    let mut samples = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let held = a
            .lock("handoff")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await?;
        let (tx, rx) = tokio::sync::oneshot::channel::<Instant>();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move {
            let g = b2
                .lock("handoff")
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(30))
                .acquire()
                .await?;
            let got = Instant::now();
            let released = rx.await.map_err(|_| "no release time")?;
            g.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                got.saturating_duration_since(released),
            )
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        held.release().await?;
        let _ = tx.send(t);
        samples.push(waiter.await??);
    }
    samples.sort();
    Ok((
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    ))
}

#[tokio::main]
async fn main() -> TestResult {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with(Durability::Production))
        .await??;
    for mode in ["on", "off"] {
        let url = format!(
            "{}?synchronous_commit={mode}&table_prefix=b{mode}_",
            server.url("postgres")
        );
        for clients in [1, 8] {
            let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
            for _ in 0..clients {
                backends.push(fencelock_postgres::open_backend(&url).await?);
            }
            let rate = cycles(&backends).await?;
            println!(
                "synchronous_commit={mode} clients={clients}: {rate:.0} acquire+release cycles/s"
            );
        }
        let (p50, p99) = handoff(&url).await?;
        println!("synchronous_commit={mode} hand-off: p50 {p50:?} p99 {p99:?}");
    }
    tokio::task::spawn_blocking(move || drop(server)).await?;
    Ok(())
}
