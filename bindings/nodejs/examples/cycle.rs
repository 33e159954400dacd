//! The Rust library's side of `bench/cycle.mjs`: one client's uncontended
//! acquire + release of one key for a while, in the same build (same
//! features, same profile) as the addon. Prints cycles per second.

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(millis)) = (args.next(), args.next()) else {
        return Err("usage: cycle URL MILLISECONDS".into());
    };
    let window = Duration::from_millis(millis.parse()?);
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
    println!("{}", cycles as f64 / started.elapsed().as_secs_f64());
    client.close().await?;
    Ok(())
}
