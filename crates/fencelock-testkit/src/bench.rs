//! Measurement helpers shared by the backends' benchmark examples
//! (`cargo run --release -p fencelock-redis --example redis_bench`). They report
//! figures; they assert nothing.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockClient, LockKey, Owner};

use crate::TestResult;

/// Acquire+release cycles per second with `clients` concurrent tasks, each
/// on a key of its own, sharing `backends` round-robin, for `cycles` cycles
/// per task.
pub async fn cycle_rate(
    backends: &[Arc<dyn Backend>],
    clients: usize,
    cycles: usize,
    ttl: Duration,
) -> TestResult<f64> {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let backend = Arc::clone(&backends[c % backends.len()]);
        tasks.push(tokio::spawn(async move {
            let request = AcquireRequest {
                key: LockKey::new(format!("bench-cycle-{c}"))?,
                owner: Owner::new(format!("bench-{c}"))?,
                ttl,
                kind: None,
                data: None,
            };
            for _ in 0..cycles {
                match backend.try_acquire(&request).await? {
                    Acquire::Granted(g) => {
                        backend
                            .release(&request.key, &request.owner, g.token)
                            .await?;
                    }
                    Acquire::Held(h) => return Err(format!("own key held: {h:?}").into()),
                }
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((clients * cycles) as f64 / started.elapsed().as_secs_f64())
}

/// Like [`cycle_rate`], but each task cycles for `duration` instead of a
/// fixed count, so slow and fast backends are measured over the same time.
pub async fn cycle_rate_for(
    backends: &[Arc<dyn Backend>],
    clients: usize,
    duration: Duration,
    ttl: Duration,
) -> TestResult<f64> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let backend = Arc::clone(&backends[c % backends.len()]);
        tasks.push(tokio::spawn(async move {
            let request = AcquireRequest {
                key: LockKey::new(format!("bench-cycle-{c}"))?,
                owner: Owner::new(format!("bench-{c}"))?,
                ttl,
                kind: None,
                data: None,
            };
            let mut done = 0usize;
            while Instant::now() < deadline {
                match backend.try_acquire(&request).await? {
                    Acquire::Granted(g) => {
                        backend
                            .release(&request.key, &request.owner, g.token)
                            .await?;
                    }
                    Acquire::Held(h) => return Err(format!("own key held: {h:?}").into()),
                }
                done += 1;
            }
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Hand-off latency on one contended key: one client holds, the other
/// waits (woken by the backend's signal), and the time from the holder's
/// release call to the waiter's grant is measured `rounds` times. Returns the
/// sorted latencies. The holder releases 5 ms after the waiter started.
pub async fn handoff(
    a: Arc<dyn Backend>,
    b: Arc<dyn Backend>,
    rounds: usize,
    ttl: Duration,
) -> TestResult<Vec<Duration>> {
    handoff_after(a, b, rounds, ttl, Duration::from_millis(5)).await
}

/// [`handoff`] with the holder releasing `hold` after the waiter started.
/// Without wake-ups the waiter polls with a backoff that grows while it
/// waits, so the hand-off latency then depends on `hold`.
pub async fn handoff_after(
    a: Arc<dyn Backend>,
    b: Arc<dyn Backend>,
    rounds: usize,
    ttl: Duration,
    hold: Duration,
) -> TestResult<Vec<Duration>> {
    let clients = [
        LockClient::builder(a)
            .owner(Owner::new("bench-a")?)
            .build()?,
        LockClient::builder(b)
            .owner(Owner::new("bench-b")?)
            .build()?,
    ];
    let key = "bench-handoff";
    let mut latencies = Vec::with_capacity(rounds);
    let mut holder = clients[0].lock(key).ttl(ttl).acquire().await?;
    for round in 0..rounds {
        let waiter = clients[(round + 1) % 2].clone();
        let task = tokio::spawn(async move {
            let guard = waiter
                .lock(key)
                .ttl(ttl)
                .wait(Duration::from_secs(30))
                .acquire()
                .await;
            (guard, Instant::now())
        });
        // Give the waiter time to try once and start waiting, so what is
        // measured is the wake-up path, not a lucky first try.
        tokio::time::sleep(hold).await;
        let released_at = Instant::now();
        holder.release().await?;
        let (guard, got_at) = task.await?;
        holder = guard?;
        latencies.push(got_at.saturating_duration_since(released_at));
    }
    holder.release().await?;
    latencies.sort();
    Ok(latencies)
}

/// The `q` quantile (0..=1) of sorted `samples`.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[i.min(samples.len() - 1)]
}
