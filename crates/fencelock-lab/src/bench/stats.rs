//! Latency percentiles, kept in an HDR histogram (three significant digits,
//! nanosecond resolution) so that merging clients and reading p99.9 costs
//! no sorting and no sample buffer.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency a histogram tracks exactly (longer ones are clamped).
const MAX_NANOS: u64 = 3_600_000_000_000;

/// Latencies of one kind of operation.
#[derive(Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        // 3 significant digits between 1 ns and an hour: the bounds are
        // constants that hdrhistogram accepts, so this cannot fail.
        let histogram =
            Histogram::new_with_bounds(1, MAX_NANOS, 3).expect("constant histogram bounds");
        Self(histogram)
    }

    pub fn record(&mut self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.saturating_record(nanos);
    }

    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so adding cannot fail; saturating
        // anyway rather than panicking mid-report.
        let _ = self.0.add(&other.0);
    }

    pub fn clear(&mut self) {
        self.0.reset();
    }

    pub fn summary(&self) -> LatencySummary {
        let ms = |nanos: u64| nanos as f64 / 1e6;
        let h = &self.0;
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            samples: h.len(),
            mean: h.mean() / 1e6,
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// Percentiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ordered_and_near_the_samples() {
        let mut a = Latencies::new();
        let mut b = Latencies::new();
        for us in 1..=1000 {
            a.record(Duration::from_micros(us));
        }
        b.record(Duration::from_millis(50));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.samples, 1001);
        assert!((s.p50 - 0.5).abs() < 0.01, "{s:?}");
        assert!(
            s.p50 <= s.p99 && s.p99 <= s.p999 && s.p999 <= s.max,
            "{s:?}"
        );
        assert!((s.max - 50.0).abs() < 0.1, "{s:?}");
    }

    #[test]
    fn an_empty_histogram_summarises_to_zeros() {
        let s = Latencies::new().summary();
        assert_eq!(s.samples, 0);
        assert_eq!(s.p999, 0.0);
    }
}
