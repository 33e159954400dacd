//! The Rust library's side of `bench/cycle.mjs`: one client's uncontended
//! acquire + release of one key for a while, in the same build (same
//! features, same profile) as the addon. Prints cycles per second.
//!
//! By default the loop runs in `#[tokio::main]`'s `block_on` on the main
//! thread, as a simple program's would; with a third argument `spawned`
//! it runs as a task on the runtime, as a service's request handlers do,
//! on the same worker as the connection's task (docs/benchmarks.md, "The
//! thinner crossing's memory, and where a Rust caller runs").

use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(millis)) = (args.next(), args.next()) else {
        return Err("usage: cycle URL MILLISECONDS [spawned]".into());
    };
    let window = Duration::from_millis(millis.parse()?);
    let rate = match args.next().as_deref() {
        None => cycle(url, window).await?,
        Some("spawned") => tokio::spawn(cycle(url, window)).await??,
        Some(other) => return Err(format!("unknown mode {other:?}: expected `spawned`").into()),
    };
    println!("{rate}");
    Ok(())
}

/// Cycles for `window`; the rate in cycles per second.
async fn cycle(url: String, window: Duration) -> Result<f64> {
    let client = fencelock::connect(&url).await?;
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed() < window {
        let guard = client
            .lock("bench:rust")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await?;
        guard.release().await?;
        cycles += 1;
    }
    let rate = cycles as f64 / started.elapsed().as_secs_f64();
    client.close().await?;
    Ok(rate)
}
