//! A measured time budget for tests against real servers.
//!
//! A test against a real server cannot run on tokio's paused clock: the
//! server's clock decides when a lease ends. So its TTLs and bounds cannot
//! be fixed either, or a busy machine fails it: a 400 ms lease whose grant
//! takes 370 ms to come back is lost at birth. A [`Patience`] measures what
//! the machine costs right now, at the start of the test: the worst
//! scheduling delay of a few short sleeps and, where the test names one,
//! the worst round trip to its server. Every TTL, wait and bound the test
//! uses is its *base* figure (what a quiet machine needs, with the margins
//! the test always had) times the measured [`factor`](Patience::factor), so
//! a loaded machine gets longer leases and longer bounds instead of a false
//! failure.
//!
//! - The base figures allow [`ALLOWANCE`] of delay. The factor is
//!   `1 + worst delay / ALLOWANCE`, never below 1 (the test keeps its
//!   meaning on a quiet machine) and never above [`MAX_FACTOR`] (a test
//!   still ends).
//! - Load comes in bursts that a measurement of a few milliseconds can fall
//!   between, so a factor measured in the same process within the last
//!   15 s is the floor of the next one.
//! - `FENCELOCK_TEST_PATIENCE=F` sets a floor under the factor, for a
//!   machine known to be slow (a debugger, an emulator).
//! - A test that still fails names its budget: [`Patience`] displays as
//!   `patience ×2.3 (scheduling delay up to 18ms, round trip up to 4ms)`,
//!   and the conformance harness appends it to every failure.
//!
//! The conformance harness measures one per case (against the case's store)
//! and sets it as the [`current`] one; the cases read their figures from
//! it. An integration test measures its own with [`Patience::measure`] or
//! [`Patience::against`].
//!
//! A figure a test needs to *report* (a latency, a rate) is no business of
//! this module: those belong in `fencelock bench`, `scorecard` and the lab,
//! never in an assertion.

use std::{
    fmt,
    future::Future,
    sync::Mutex,
    time::{Duration, Instant},
};

use fencelock_core::{Backend, LockKey};

/// The delay the base figures of the tests allow for: a scheduling delay
/// or round trip up to this costs a test nothing.
pub const ALLOWANCE: Duration = Duration::from_millis(10);
/// The largest factor: beyond it the machine is not running tests but
/// thrashing, and a test that waited that long would not end.
pub const MAX_FACTOR: f64 = 16.0;
/// Short sleeps timed to find the scheduling delay.
const SLEEPS: usize = 16;
/// Round trips timed, where the test names a server.
const ROUND_TRIPS: usize = 8;
/// The floor's variable.
const FLOOR_VAR: &str = "FENCELOCK_TEST_PATIENCE";

tokio::task_local! {
    static CURRENT: Patience;
}
/// What this process measured: the last budget, for code outside a case's
/// task (a task it spawned, a helper called from a plain test), and each
/// measurement's own factor within [`MEMORY`], the floor of the next one.
static MEASURED: Mutex<Measured> = Mutex::new(Measured {
    last: None,
    recent: Vec::new(),
});

struct Measured {
    last: Option<Patience>,
    /// When each factor was measured, and the factor its samples gave.
    recent: Vec<(Instant, f64)>,
}
/// How long a measured factor stays the floor of later measurements in
/// the same process: load comes in bursts (a link step, a test starting its
/// servers) that a short measurement can fall between.
const MEMORY: Duration = Duration::from_secs(15);

/// A time budget measured on this machine, now. See the [module
/// docs](self).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Patience {
    factor: f64,
    scheduling: Duration,
    round_trip: Option<Duration>,
}

impl Patience {
    /// Measures the scheduling delay: the worst overshoot of a few 1 ms
    /// sleeps on the current runtime (its timer and its workers' wait for a
    /// core both count).
    pub async fn measure() -> Self {
        Self::from_samples(scheduling_delay().await, None, floor())
    }

    /// [`measure`](Self::measure), and the worst of a few round trips to
    /// `backend` (an `inspect` of a key nobody uses).
    pub async fn against(backend: &dyn Backend) -> Self {
        let probe =
            LockKey::new("fencelock-testkit:patience-probe").expect("the probe key is valid");
        Self::with_round_trip(|| async {
            // An error is a round trip too: a backend that refuses the
            // probe still answered it.
            let _ = backend.inspect(&probe).await;
        })
        .await
    }

    /// [`measure`](Self::measure), and the worst of a few runs of
    /// `round_trip`, one request to the test's server.
    pub async fn with_round_trip<F, Fut>(mut round_trip: F) -> Self
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        let scheduling = scheduling_delay().await;
        let mut worst = Duration::ZERO;
        for _ in 0..ROUND_TRIPS {
            let started = Instant::now();
            round_trip().await;
            worst = worst.max(started.elapsed());
        }
        Self::from_samples(scheduling, Some(worst), floor())
    }

    /// A budget of exactly `factor` (at least 1), for tests of code that
    /// takes a [`Patience`].
    pub fn fixed(factor: f64) -> Self {
        Self {
            factor: factor.clamp(1.0, MAX_FACTOR),
            scheduling: Duration::ZERO,
            round_trip: None,
        }
    }

    /// The budget of these samples, no less than `floor` and than the
    /// factor this process measured within [`MEMORY`]; it becomes the last.
    fn from_samples(scheduling: Duration, round_trip: Option<Duration>, floor: f64) -> Self {
        let mut measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
        // The samples' own factor is remembered, not the floored one, so
        // that a burst's factor is forgotten after MEMORY.
        let own = Self::of(scheduling, round_trip, 1.0).factor;
        measured.recent.retain(|(at, _)| at.elapsed() < MEMORY);
        let recent = measured
            .recent
            .iter()
            .map(|&(_, factor)| factor)
            .fold(1.0, f64::max);
        measured.recent.push((Instant::now(), own));
        let patience = Self::of(scheduling, round_trip, floor.max(recent));
        measured.last = Some(patience);
        patience
    }

    /// The budget of these samples and `floor`, remembering nothing.
    fn of(scheduling: Duration, round_trip: Option<Duration>, floor: f64) -> Self {
        let worst = scheduling + round_trip.unwrap_or_default();
        let measured = 1.0 + worst.as_secs_f64() / ALLOWANCE.as_secs_f64();
        Self {
            factor: measured.max(floor).clamp(1.0, MAX_FACTOR),
            scheduling,
            round_trip,
        }
    }

    /// What every base figure is multiplied by: 1 on a quiet machine.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// A TTL whose base is `base`: long enough that a grant, its renewals
    /// and the test's own steps fit in it on this machine now.
    pub fn ttl(&self, base: Duration) -> Duration {
        self.scale(base)
    }

    /// A bound (a wait, a timeout, a deadline for something to happen)
    /// whose base is `base`.
    pub fn bound(&self, base: Duration) -> Duration {
        self.scale(base)
    }

    /// `base` times the factor, rounded up to the millisecond: engines and
    /// the service's wire count leases in whole milliseconds, and a figure
    /// with a fraction of one would be granted a shade less than asked.
    fn scale(&self, base: Duration) -> Duration {
        let scaled = base.mul_f64(self.factor);
        let millis = u64::try_from(scaled.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Duration::from_millis(millis)
    }

    /// Runs `future` with this budget as the [`current`] one.
    pub async fn scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }
}

impl fmt::Display for Patience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "patience ×{:.1} (scheduling delay up to {:?}",
            self.factor, self.scheduling
        )?;
        if let Some(round_trip) = self.round_trip {
            write!(f, ", round trip up to {round_trip:?}")?;
        }
        write!(f, ")")
    }
}

/// The budget of the task running now: the one its case's
/// [`scope`](Patience::scope) set, else the last one this process measured,
/// else a factor of 1 (or the floor).
pub fn current() -> Patience {
    CURRENT
        .try_with(|patience| *patience)
        .ok()
        .or_else(|| MEASURED.lock().unwrap_or_else(|e| e.into_inner()).last)
        .unwrap_or_else(|| Patience::fixed(floor()))
}

/// `d` as the `NNNms` that URL options and CLI flags parse, rounded up to
/// the millisecond: scaled figures carry nanoseconds, and a bound rounded
/// down (a `max_ttl`, say) would refuse the figure it was scaled with.
pub fn ms(d: Duration) -> String {
    format!("{}ms", d.as_nanos().div_ceil(1_000_000))
}

/// `FENCELOCK_TEST_PATIENCE`, or 1.
fn floor() -> f64 {
    std::env::var(FLOOR_VAR)
        .ok()
        .and_then(|value| value.trim().parse::<f64>().ok())
        .filter(|factor| factor.is_finite())
        .unwrap_or(1.0)
}

/// The worst overshoot of [`SLEEPS`] sleeps of 1 ms.
async fn scheduling_delay() -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..SLEEPS {
        let asked = Duration::from_millis(1);
        let started = Instant::now();
        tokio::time::sleep(asked).await;
        worst = worst.max(started.elapsed().saturating_sub(asked));
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_machine_keeps_the_base_figures() {
        let quiet = Patience::of(Duration::ZERO, Some(Duration::ZERO), 1.0);
        assert_eq!(quiet.factor(), 1.0);
        assert_eq!(
            quiet.ttl(Duration::from_millis(400)),
            Duration::from_millis(400)
        );
    }

    #[test]
    fn delay_lengthens_every_figure_in_proportion() {
        let busy = Patience::of(
            Duration::from_millis(15),
            Some(Duration::from_millis(5)),
            1.0,
        );
        assert!((busy.factor() - 3.0).abs() < 1e-9, "{busy}");
        let odd = Patience::of(Duration::from_micros(12_345), None, 1.0);
        assert_eq!(
            odd.ttl(Duration::from_millis(100)),
            Duration::from_millis(224)
        );
        assert_eq!(
            busy.ttl(Duration::from_millis(400)),
            Duration::from_millis(1200)
        );
        assert_eq!(busy.bound(Duration::from_secs(2)), Duration::from_secs(6));
        assert!(busy.to_string().contains("round trip up to 5ms"), "{busy}");
    }

    #[test]
    fn a_scaled_figure_is_written_in_whole_milliseconds_rounded_up() {
        assert_eq!(ms(Duration::from_millis(1200)), "1200ms");
        assert_eq!(ms(Duration::from_nanos(1_200_000_001)), "1201ms");
    }

    #[test]
    fn the_floor_holds_on_a_quiet_machine_and_the_cap_on_a_thrashing_one() {
        let floored = Patience::of(Duration::ZERO, None, 2.5);
        assert_eq!(floored.factor(), 2.5);
        let thrashing = Patience::of(Duration::from_secs(60), None, 1.0);
        assert_eq!(thrashing.factor(), MAX_FACTOR);
    }

    #[test]
    fn a_burst_measured_lately_is_the_floor_of_the_next_budget() {
        let burst = Patience::from_samples(Duration::from_millis(50), None, 1.0);
        let after = Patience::from_samples(Duration::ZERO, None, 1.0);
        assert!(after.factor() >= burst.factor(), "{after} after {burst}");
    }

    #[tokio::test]
    async fn the_scope_is_the_current_budget() {
        let (outer, inner) = (Patience::fixed(2.0), Patience::fixed(4.0));
        let seen = outer
            .scope(async move { (current(), inner.scope(async { current() }).await, current()) })
            .await;
        assert_eq!(seen, (outer, inner, outer));
    }
}
