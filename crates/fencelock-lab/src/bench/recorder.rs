//! A process-wide `metrics` recorder that keeps just what the benchmark
//! reads from the library: acquisition attempts (to know when a waiter is
//! blocked), renewals, renewal failures, losses, and the renewal latency
//! histogram. Labels are ignored (one process, one backend).

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex, OnceLock, PoisonError,
};

use fencelock::metrics as m;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::sync::Notify;

use super::stats::Latencies;

/// A counter that also wakes whoever waits for it to move.
#[derive(Default)]
pub struct Count {
    value: AtomicU64,
    moved: Notify,
}

impl Count {
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    pub fn increment_by_one(&self) {
        CounterFn::increment(self, 1);
    }

    /// Waits until the count exceeds `than`.
    pub async fn above(&self, than: u64) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            // Registered before the check, so an increment in between is
            // not missed.
            moved.as_mut().enable();
            if self.get() > than {
                return;
            }
            moved.await;
        }
    }
}

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.value.fetch_add(value, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    fn absolute(&self, value: u64) {
        self.value.fetch_max(value, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

/// Renewal round-trip times, in a histogram the scenario can clear.
#[derive(Default)]
pub struct RenewTimes(Mutex<Latencies>);

impl RenewTimes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Latencies> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    pub fn snapshot(&self) -> Latencies {
        self.lock().clone()
    }
}

impl HistogramFn for RenewTimes {
    fn record(&self, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.lock()
                .record(std::time::Duration::from_secs_f64(seconds));
        }
    }
}

/// What the library reported.
#[derive(Default)]
pub struct Observed {
    pub attempts: Arc<Count>,
    pub renewals: Arc<Count>,
    pub renewal_failures: Arc<Count>,
    pub lost: Arc<Count>,
    pub renew_times: Arc<RenewTimes>,
}

struct BenchRecorder(&'static Observed);

impl Recorder for BenchRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let o = self.0;
        let count = match key.name() {
            m::ACQUIRE_ATTEMPTS => &o.attempts,
            m::RENEWALS => &o.renewals,
            m::RENEWAL_FAILURES => &o.renewal_failures,
            m::LOCKS_LOST => &o.lost,
            _ => return Counter::noop(),
        };
        Counter::from_arc(Arc::clone(count))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == m::RENEW_SECONDS {
            Histogram::from_arc(Arc::clone(&self.0.renew_times))
        } else {
            Histogram::noop()
        }
    }
}

/// Installs the recorder (once per process) and returns what it observes.
/// Only the scenarios that read it install it, so `cycle` and `contended`
/// measure the library with no recorder, as most users run it.
pub fn install() -> &'static Observed {
    static OBSERVED: OnceLock<&'static Observed> = OnceLock::new();
    OBSERVED.get_or_init(|| {
        let observed: &'static Observed = Box::leak(Box::default());
        // Fails only if another recorder is installed, which this binary
        // never does: the counts then stay at zero and the report says so.
        let _ = metrics::set_global_recorder(BenchRecorder(observed));
        observed
    })
}
