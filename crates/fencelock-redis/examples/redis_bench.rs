//! Acquire+release cycles/s (1 and 64 clients, distinct keys), the engine's
//! own limit for the same script (`redis-benchmark … EVALSHA` on one
//! connection), and hand-off latency on one contended key.
//!
//! ```text
//! cargo run --release -p fencelock-redis --example redis_bench
//! ```
//!
//! Starts a throwaway `redis-server` on a free loopback port (never the
//! machine's own). Prints figures; asserts nothing.

use std::{process::Command, sync::Arc, time::Duration};

use fencelock_core::Backend;
use fencelock_redis::RedisBackend;
use fencelock_testkit::{
    bench::{cycle_rate, handoff, quantile},
    servers::{find_binary, redis::RedisServer},
    TestResult,
};

const TTL: Duration = Duration::from_secs(30);

/// Calls per second of the acquire script by EVALSHA, as `redis-benchmark
/// --csv -n requests -c connections` reports it, on random keys (so every
/// call is a grant; TTL 1 ms so the keys vanish).
fn redis_benchmark(port: u16, sha: &str, requests: u32, connections: u32) -> TestResult<f64> {
    let bin = find_binary("redis-benchmark", &[], "redis-tools")?;
    let out = Command::new(bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args(["-n", &requests.to_string(), "-c", &connections.to_string()])
        .args(["-r", "1000000", "EVALSHA", sha, "2"])
        .args(["bench:{raw__rand_int__}", "bench:{raw__rand_int__}:token"])
        .args(["owner", "1", "", ""])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // CSV: "test","rps",… — the second field of the last data line.
    let rps = text
        .lines()
        .filter(|l| !l.starts_with("\"test\""))
        .filter_map(|l| l.split(',').nth(1))
        .filter_map(|f| f.trim_matches('"').parse::<f64>().ok())
        .next_back()
        .ok_or_else(|| format!("no rate in redis-benchmark output: {text}"))?;
    Ok(rps)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> TestResult {
    let server = RedisServer::start()?;
    let url = format!("{}?prefix=bench", server.url(0));
    let backend = RedisBackend::open(&url).await?;
    let sha = backend.acquire_script_sha().to_owned();
    let one: Vec<Arc<dyn Backend>> = vec![Arc::new(backend.clone())];

    let raw = redis_benchmark(server.port(), &sha, 50_000, 1)?;
    println!("raw EVALSHA acquire script, 1 connection (redis-benchmark -c 1): {raw:.0} calls/s");
    println!(
        "  => raw acquire+release cycle bound (half):                 {:.0} cycles/s",
        raw / 2.0
    );

    cycle_rate(&one, 1, 2000, TTL).await?; // warm-up
    let single = cycle_rate(&one, 1, 20000, TTL).await?;
    println!(
        "fencelock acquire+release, 1 client:   {single:.0} cycles/s ({:.0}% of the raw cycle bound)",
        100.0 * single / (raw / 2.0)
    );
    let many = cycle_rate(&one, 64, 1000, TTL).await?;
    println!(
        "fencelock acquire+release, 64 clients: {many:.0} cycles/s (one multiplexed connection)"
    );
    let raw64 = redis_benchmark(server.port(), &sha, 200_000, 64)?;
    println!("raw EVALSHA acquire script, 64 connections: {raw64:.0} calls/s");

    let a: Arc<dyn Backend> = Arc::new(RedisBackend::open(&url).await?);
    let b: Arc<dyn Backend> = Arc::new(RedisBackend::open(&url).await?);
    let lat = handoff(a, b, 300, TTL).await?;
    println!(
        "hand-off latency (release -> waiter granted, pub/sub wake-up), 300 rounds: p50 {:?}, p99 {:?}",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99)
    );
    Ok(())
}
