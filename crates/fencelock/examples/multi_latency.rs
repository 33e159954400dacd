//! Latency of taking three keys at once against a store given by URL:
//! `lock_all` (one atomic step where the backend claims `atomic_multi`)
//! beside three single-key acquisitions in sorted order (what `lock_all`
//! did on every backend before). Quiet keys, one client, releases not
//! timed. Prints the median and the 99th percentile of each.
//!
//! ```text
//! cargo run --release -p fencelock --all-features --example multi_latency -- URL [ROUNDS]
//! ```

use std::time::{Duration, Instant};

const KEYS: [&str; 3] = ["ml-a", "ml-b", "ml-c"];

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{name:<28} median {:>8.0} µs   p99 {:>8.0} µs   ({} rounds)",
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        samples.len()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: multi_latency URL [ROUNDS]")?;
    let rounds: usize = args.next().map_or(Ok(500), |r| r.parse())?;
    let client = fencelock::connect(&url).await?;
    println!(
        "{} (atomic_multi: {})",
        client.backend().name(),
        client.backend().capabilities().atomic_multi
    );
    let (mut atomic, mut sequential) = (Vec::new(), Vec::new());
    // Warm-up rounds (connections, prepared statements) are not counted.
    for round in 0..rounds + 20 {
        let started = Instant::now();
        let all = client.lock_all(KEYS).acquire().await?;
        let took = started.elapsed();
        all.release().await?;
        let started = Instant::now();
        let mut guards = Vec::new();
        for key in KEYS {
            guards.push(client.lock(key).acquire().await?);
        }
        let took_sequential = started.elapsed();
        for guard in guards {
            guard.release().await?;
        }
        if round >= 20 {
            atomic.push(took);
            sequential.push(took_sequential);
        }
    }
    summary("lock_all (3 keys)", atomic);
    summary("3 × lock, sorted order", sequential);
    Ok(())
}
