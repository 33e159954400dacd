//! The one measurement loop every throughput scenario uses, for the library
//! and for the raw baseline alike: `clients` tasks, each repeating its
//! operation for the warm-up and then for the measured time, recording each
//! operation's latency.

use std::time::Duration;

use fencelock::{async_trait, baseline::RawCycle, LockClient, Result};
use serde::Serialize;
use tokio::time::{sleep_until, Instant};

use super::{
    process,
    stats::{Latencies, LatencySummary},
};

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

/// One permit of semaphore `name` taken without waiting and given back.
pub struct PermitCycle {
    pub client: LockClient,
    pub name: String,
    pub permits: u32,
    pub ttl: Duration,
}

#[async_trait]
impl Op for PermitCycle {
    async fn run(&mut self) -> Result<bool> {
        let request = self
            .client
            .semaphore(self.name.as_str(), self.permits)
            .ttl(self.ttl);
        match request.try_acquire().await? {
            Some(permit) => {
                permit.release().await?;
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
    /// CPU (user + system) this whole process used per operation during the
    /// window, microseconds: what the client side costs, whatever the
    /// throughput on a shared machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cpu_us_per_op: Option<f64>,
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
            ops_per_sec: if seconds > 0.0 {
                ops as f64 / seconds
            } else {
                0.0
            },
            success_rate: if tried > 0 {
                successes as f64 / tried as f64
            } else {
                0.0
            },
            latency_ms: latencies.summary(),
            client_cpu_us_per_op: None,
            first_error,
        }
    }

    /// Adds the process's CPU use over the window.
    pub fn with_cpu(mut self, cpu: Option<Duration>) -> Self {
        self.client_cpu_us_per_op = cpu
            .filter(|_| self.ops > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / self.ops as f64);
        self
    }
}

/// What one or more measured windows counted, before it becomes
/// [`Figures`]; windows of several rounds add up.
#[derive(Default)]
pub struct Tally {
    ops: u64,
    successes: u64,
    errors: u64,
    latencies: Latencies,
    first_error: Option<String>,
    elapsed: Duration,
    cpu: Option<Duration>,
}

impl Tally {
    pub fn add(&mut self, other: Tally) {
        self.ops += other.ops;
        self.successes += other.successes;
        self.errors += other.errors;
        self.latencies.merge(&other.latencies);
        self.first_error = self.first_error.take().or(other.first_error);
        self.elapsed += other.elapsed;
        self.cpu = match (self.cpu, other.cpu) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }

    pub fn figures(&self) -> Figures {
        Figures::new(
            self.ops,
            self.successes,
            self.errors,
            self.elapsed,
            &self.latencies,
            self.first_error.clone(),
        )
        .with_cpu(self.cpu)
    }
}

/// Runs every op in its own task: `warmup` unmeasured, then `duration`
/// measured. A task whose op fails permanently stops (its error is
/// reported); transient errors are counted and the op goes on.
pub async fn drive(ops: Vec<Box<dyn Op>>, warmup: Duration, duration: Duration) -> Tally {
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
    sleep_until(start).await;
    let cpu_before = process::cpu_time();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(t) => total.add(t),
            Err(e) => {
                total.errors += 1;
                total
                    .first_error
                    .get_or_insert_with(|| format!("a client task failed: {e}"));
            }
        }
    }
    total.elapsed = Instant::now().saturating_duration_since(start);
    total.cpu = process::cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    total
}
