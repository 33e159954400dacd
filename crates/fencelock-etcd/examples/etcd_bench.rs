//! Acquire+release cycles/s (1 and 64 clients, distinct keys), the engine's
//! own limit measured the same way with raw etcd-client calls (a
//! put-if-absent Txn + Delete per cycle), and hand-off latency on one
//! contended key.
//!
//! ```text
//! cargo run --release -p fencelock-etcd --example etcd_bench
//! ```
//!
//! Starts a throwaway single-member `etcd` on free loopback ports. Prints
//! figures; asserts nothing.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use fencelock_core::Backend;
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{
    bench::{cycle_rate, handoff, quantile},
    servers::etcd::EtcdCluster,
    TestResult,
};

const TTL: Duration = Duration::from_secs(30);

/// Raw cycles/s: `clients` tasks each doing put-if-absent Txn + Delete on a
/// key of its own, `cycles` times, over one shared client.
async fn raw_rate(endpoint: &str, clients: usize, cycles: usize) -> TestResult<f64> {
    let client = Client::connect([endpoint], None).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("raw/{c}");
            for _ in 0..cycles {
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), "v", None)])
                    .or_else([TxnOp::get(key.clone(), None)]);
                client.txn(txn).await?;
                client.delete(key.clone(), None).await?;
            }
            Ok::<(), etcd_client::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((clients * cycles) as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> TestResult {
    let server = EtcdCluster::start()?;
    let url = format!("{}?prefix=bench", server.url());
    let one: Vec<Arc<dyn Backend>> = vec![Arc::new(EtcdBackend::open(&url).await?)];

    raw_rate(&server.endpoint(0), 1, 200).await?; // warm-up
    let raw1 = raw_rate(&server.endpoint(0), 1, 2000).await?;
    println!("raw Txn(put-if-absent)+Delete, 1 client:   {raw1:.0} cycles/s");
    let raw64 = raw_rate(&server.endpoint(0), 64, 100).await?;
    println!("raw Txn(put-if-absent)+Delete, 64 clients: {raw64:.0} cycles/s");

    cycle_rate(&one, 1, 200, TTL).await?; // warm-up
    let single = cycle_rate(&one, 1, 2000, TTL).await?;
    println!(
        "fencelock acquire+release (LeaseGrant+Txn, LeaseRevoke), 1 client: {single:.0} cycles/s ({:.0}% of raw)",
        100.0 * single / raw1
    );
    let many = cycle_rate(&one, 64, 100, TTL).await?;
    println!(
        "fencelock acquire+release, 64 clients: {many:.0} cycles/s ({:.0}% of raw)",
        100.0 * many / raw64
    );

    let a: Arc<dyn Backend> = Arc::new(EtcdBackend::open(&url).await?);
    let b: Arc<dyn Backend> = Arc::new(EtcdBackend::open(&url).await?);
    let lat = handoff(a, b, 200, TTL).await?;
    println!(
        "hand-off latency (release -> waiter granted, watch wake-up), 200 rounds: p50 {:?}, p99 {:?}",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99)
    );
    Ok(())
}
