//! The one measurement loop every throughput scenario uses, for the library
//! and for the raw baseline alike: `clients` tasks, each repeating its
//! operation for the warm-up and then for the measured time, recording each
//! operation's latency.

use std::time::Duration;

use fencelock::{async_trait, baseline::RawCycle, LockClient, Result};
use serde::Serialize;
use tokio::time::Instant;

use super::stats::{LatencySummary, Latencies};

/// One benchmark operation.
#[async_trait]
pub trait Op: Send + 'static {
    /// `Ok(true)`: it did what it set out to; `Ok(false)`: a legitimate
    /// miss (the key was held).
    async fn run(&mut self) -> Result<bool>;
}

/// One acquire+release through the library, on the next of `keys`.
pub struct LibraryCycle {
    pub client: LockClient,
    pub keys: Keys,
    pub ttl: Duration,
}

#[async_trait]
impl Op for LibraryCycle {
    async fn run(&mut self) -> Result<bool> {
        let key = self.keys.next();
        match self.client.lock(key).ttl(self.ttl).try_acquire().await? {
            Some(guard) => {
                guard.release().await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// One acquire+release on the engine's raw connection.
pub struct RawCycleOp {
    pub raw: Box<dyn RawCycle>,
    pub keys: Keys,
    pub ttl: Duration,
}

#[async_trait]
impl Op for RawCycleOp {
    async fn run(&mut self) -> Result<bool> {
        let key = self.keys.next();
        match self.raw.acquire(key, self.ttl).await? {
            Some(token) => {
                if !self.raw.release(key, token).await? {
                    return Err(fencelock::Error::InvalidArgument(format!(
                        "raw release of {key} found nothing to release"
                    )));
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A client's keys, taken in turn.
pub struct Keys {
    names: Vec<String>,
    next: usize,
}

impl Keys {
    pub fn new(names: Vec<String>) -> Self {
        Self { names, next: 0 }
    }

    fn next(&mut self) -> &str {
        let i = self.next % self.names.len().max(1);
        self.next = self.next.wrapping_add(1);
        self.names.get(i).map_or("", String::as_str)
    }
}

/// What a run of one side (library or raw) measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Operations completed in the measured window.
    pub ops: u64,
    /// Of those, the ones that did what they set out to.
    pub successes: u64,
    /// Operations that failed with an error.
    pub errors: u64,
    /// The measured window, in seconds.
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// `successes / (ops + errors)`.
    pub success_rate: f64,
    /// Per-operation latency, milliseconds.
    pub latency_ms: LatencySummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

impl Figures {
    pub fn new(
        ops: u64,
        successes: u64,
        errors: u64,
        elapsed: Duration,
        latencies: &Latencies,
        first_error: Option<String>,
    ) -> Self {
        let seconds = elapsed.as_secs_f64();
        let tried = ops + errors;
        Self {
            ops,
            successes,
            errors,
            seconds,
            ops_per_sec: if seconds > 0.0 { ops as f64 / seconds } else { 0.0 },
            success_rate: if tried > 0 {
                successes as f64 / tried as f64
            } else {
                0.0
            },
            latency_ms: latencies.summary(),
            first_error,
        }
    }
}

#[derive(Default)]
struct Tally {
    ops: u64,
    successes: u64,
    errors: u64,
    latencies: Latencies,
    first_error: Option<String>,
}

/// Runs every op in its own task: `warmup` unmeasured, then `duration`
/// measured. A task whose op fails permanently stops (its error is
/// reported); transient errors are counted and the op goes on.
pub async fn drive(ops: Vec<Box<dyn Op>>, warmup: Duration, duration: Duration) -> Figures {
    let start = Instant::now() + warmup;
    let end = start + duration;
    let tasks: Vec<_> = ops
        .into_iter()
        .map(|mut op| {
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let outcome = op.run().await;
                    if began < start {
                        match outcome {
                            Err(e) if !e.is_transient() => {
                                tally.errors += 1;
                                tally.first_error = Some(e.to_string());
                                break;
                            }
                            _ => continue,
                        }
                    }
                    match outcome {
                        Ok(done) => {
                            tally.ops += 1;
                            tally.successes += u64::from(done);
                            tally.latencies.record(began.elapsed());
                        }
                        Err(e) => {
                            tally.errors += 1;
                            tally.first_error.get_or_insert_with(|| e.to_string());
                            if !e.is_transient() {
                                break;
                            }
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(t) => {
                total.ops += t.ops;
                total.successes += t.successes;
                total.errors += t.errors;
                total.latencies.merge(&t.latencies);
                if total.first_error.is_none() {
                    total.first_error = t.first_error;
                }
            }
            Err(e) => {
                total.errors += 1;
                total
                    .first_error
                    .get_or_insert_with(|| format!("a client task failed: {e}"));
            }
        }
    }
    let elapsed = Instant::now().saturating_duration_since(start);
    Figures::new(
        total.ops,
        total.successes,
        total.errors,
        elapsed,
        &total.latencies,
        total.first_error,
    )
}
