//! Exponential backoff with full jitter: the fallback when a backend cannot
//! wake waiters, and the pacing of retries after transient errors.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with full jitter ("sleep a random time between zero
/// and the current cap, then double the cap"). Full jitter spreads waiters out
/// so that a release is not followed by a stampede of simultaneous retries.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    cap: Duration,
}

impl Backoff {
    /// Starts with caps `initial`, `2·initial`, … up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_micros(100));
        let max = max.max(initial);
        Self {
            initial,
            max,
            cap: initial,
        }
    }

    /// The next pause: uniform in `[0, cap]`, then the cap doubles.
    pub fn next_pause(&mut self) -> Duration {
        let pause = rand::thread_rng().gen_range(Duration::ZERO..=self.cap);
        self.cap = (self.cap * 2).min(self.max);
        pause
    }

    /// The next pause of a retry of one's own request (a renewal after a
    /// transient failure): uniform in `[cap/2, cap]` ("equal jitter"), then
    /// the cap doubles. Full jitter spreads a crowd of waiters, but a lone
    /// retry can then draw pauses near zero and fire several requests
    /// within a millisecond at a service that is down; with half the cap as
    /// a floor, a lease costs a bounded number of attempts per TTL.
    pub fn next_retry(&mut self) -> Duration {
        let pause = rand::thread_rng().gen_range(self.cap / 2..=self.cap);
        self.cap = (self.cap * 2).min(self.max);
        pause
    }

    /// Back to the initial cap (after progress).
    pub fn reset(&mut self) {
        self.cap = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stay_under_a_doubling_cap() {
        let mut b = Backoff::new(Duration::from_millis(2), Duration::from_millis(50));
        let caps = [2, 4, 8, 16, 32, 50, 50, 50];
        for cap in caps {
            assert!(b.next_pause() <= Duration::from_millis(cap));
        }
        b.reset();
        assert!(b.next_pause() <= Duration::from_millis(2));
    }

    #[test]
    fn retries_pause_at_least_half_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(2), Duration::from_millis(50));
        for cap in [2, 4, 8, 16, 32, 50, 50, 50] {
            let pause = b.next_retry();
            let cap = Duration::from_millis(cap);
            assert!(
                pause >= cap / 2 && pause <= cap,
                "{pause:?} for a cap of {cap:?}"
            );
        }
    }
}
