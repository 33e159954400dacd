//! The checker: a pure function over the recorded history.
//!
//! Violations (any one fails the run):
//!
//! - **stale write admitted**: an admitted write whose token is lower than a
//!   token admitted (at a read or a write) before it;
//! - **lost update**: an admitted write that did not read the value the
//!   previous admitted write wrote; and, separately, a final counter that
//!   differs from the number of admitted increments;
//! - **token regression**: a grant whose token is not above the token of a
//!   grant that completed before this grant's acquire was requested (I2). The
//!   times are `CLOCK_MONOTONIC`, one clock for every process of the host.
//!
//! Also counted: overlaps (two workers' belief intervals, from the grant to
//! the first of release and noticed loss, intersect: what the fence made
//! harmless), locks lost and noticed, refused writes, faults by kind.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::history::{Event, Kind};

/// How many examples of each violation the report keeps.
const EXAMPLES: usize = 10;

/// Violations of one kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Found {
    /// How many.
    pub count: u64,
    /// The first few, with the rows that show them.
    pub examples: Vec<Example>,
}

impl Found {
    fn add(&mut self, what: String, events: Vec<Event>) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(Example { what, events });
        }
    }
}

/// One violation.
#[derive(Clone, Debug, Serialize)]
pub struct Example {
    /// What is wrong.
    pub what: String,
    /// The history rows involved.
    pub events: Vec<Event>,
}

/// What the history shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Analysis {
    /// Locks granted.
    pub grants: u64,
    /// Writes attempted.
    pub writes_attempted: u64,
    /// Writes the store took.
    pub writes_admitted: u64,
    /// Writes the fence refused (stale holders stopped at the resource).
    pub writes_refused: u64,
    /// Tokens the fence refused before reading (a newer holder got in
    /// between the grant and the first admit).
    pub admits_refused: u64,
    /// Guards whose loss signal fired.
    pub locks_lost: u64,
    /// Releases that found the lease already gone.
    pub releases_not_held: u64,
    /// Releases that failed (the lease then ends by expiry).
    pub releases_failed: u64,
    /// Failed lock operations (acquire errors while the backend was down or
    /// cut off), retried by the workers.
    pub errors: u64,
    /// Pairs of workers that believed they held the lock at the same time.
    pub overlaps: u64,
    /// The longest such overlap, in milliseconds.
    pub longest_overlap_ms: f64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// The counter at the end.
    pub final_counter: i64,
    /// Admitted writes with a token below one admitted before.
    pub stale_writes: Found,
    /// Admitted writes that did not read the previous admitted write's value.
    pub lost_updates: Found,
    /// A final counter other than the number of admitted increments.
    pub counter_mismatch: Found,
    /// Grants whose token did not exceed an earlier completed grant's.
    pub token_regressions: Found,
}

impl Analysis {
    /// All violations.
    pub fn violations(&self) -> u64 {
        self.stale_writes.count
            + self.lost_updates.count
            + self.counter_mismatch.count
            + self.token_regressions.count
    }

    /// Faults injected, all kinds.
    pub fn fault_count(&self) -> u64 {
        self.faults.values().sum()
    }
}

/// Checks `events` (in commit order) and the counter's final value.
pub fn check(events: &[Event], final_counter: i64) -> Analysis {
    let mut a = Analysis {
        final_counter,
        ..Analysis::default()
    };
    count(events, &mut a);
    check_writes(events, &mut a);
    check_tokens(events, &mut a);
    overlaps(events, &mut a);
    a
}

fn count(events: &[Event], a: &mut Analysis) {
    for e in events {
        match e.kind {
            Kind::Grant => a.grants += 1,
            Kind::Admit if !e.admitted() => a.admits_refused += 1,
            Kind::Write => {
                a.writes_attempted += 1;
                if e.admitted() {
                    a.writes_admitted += 1;
                } else {
                    a.writes_refused += 1;
                }
            }
            Kind::Lost => a.locks_lost += 1,
            Kind::Release => match e.outcome.as_deref() {
                Some("ok") => {}
                Some("not-held") => a.releases_not_held += 1,
                _ => a.releases_failed += 1,
            },
            Kind::Error => a.errors += 1,
            Kind::Fault => {
                let kind = e.detail.clone().unwrap_or_else(|| "unknown".into());
                *a.faults.entry(kind).or_default() += 1;
            }
            Kind::Admit | Kind::Read => {}
        }
    }
}

/// Stale writes and lost updates, walking the admitted writes in commit
/// order.
fn check_writes(events: &[Event], a: &mut Analysis) {
    let mut highest: Option<&Event> = None;
    let mut previous: Option<&Event> = None;
    for e in events.iter().filter(|e| e.admitted()) {
        if e.kind == Kind::Write {
            if let Some(h) = highest.filter(|h| h.token > e.token) {
                a.stale_writes.add(
                    format!(
                        "worker {} wrote with token {} after token {} was admitted",
                        show(e.worker),
                        show(e.token),
                        show(h.token)
                    ),
                    vec![h.clone(), e.clone()],
                );
            }
            let expected = previous.and_then(|p| p.value_written).unwrap_or(0);
            if e.value_read != Some(expected) {
                a.lost_updates.add(
                    format!(
                        "worker {} (token {}) read {} but the previous admitted write \
                         wrote {expected}",
                        show(e.worker),
                        show(e.token),
                        show(e.value_read)
                    ),
                    previous.into_iter().chain([e]).cloned().collect(),
                );
            }
            previous = Some(e);
        }
        if highest.is_none_or(|h| e.token > h.token) {
            highest = Some(e);
        }
    }
    let increments = i64::try_from(a.writes_admitted).unwrap_or(i64::MAX);
    if a.final_counter != increments {
        a.counter_mismatch.add(
            format!(
                "the final counter is {} but {increments} increments were admitted",
                a.final_counter
            ),
            Vec::new(),
        );
    }
}

/// Token regressions: for each grant, the highest token among the grants
/// that completed before its request was sent must be lower than its own.
fn check_tokens(events: &[Event], a: &mut Analysis) {
    let mut grants: Vec<&Event> = events.iter().filter(|e| e.kind == Kind::Grant).collect();
    grants.sort_by_key(|g| g.t_us);
    // best[i]: the grant with the highest token among grants[..i].
    let mut best: Vec<Option<&Event>> = Vec::with_capacity(grants.len() + 1);
    best.push(None);
    for g in &grants {
        let prev = best.last().copied().flatten();
        best.push(match prev {
            Some(p) if p.token >= g.token => Some(p),
            _ => Some(g),
        });
    }
    for g in &grants {
        let requested = g.t_start_us.unwrap_or(g.t_us);
        let before = grants.partition_point(|o| o.t_us < requested);
        if let Some(earlier) = best[before].filter(|e| e.token >= g.token) {
            a.token_regressions.add(
                format!(
                    "worker {} was granted token {}, not above token {} granted to \
                     worker {} before it asked",
                    show(g.worker),
                    show(g.token),
                    show(earlier.token),
                    show(earlier.worker)
                ),
                vec![earlier.clone(), (*g).clone()],
            );
        }
    }
}

/// A field of a history row, `?` when the row lacks it.
fn show<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

/// Pairs of intersecting belief intervals of different workers.
fn overlaps(events: &[Event], a: &mut Analysis) {
    let run_end = events.iter().map(|e| e.t_us).max().unwrap_or(0);
    // The end of each belief: release called, or loss noticed, if earlier.
    let mut ends: HashMap<(Option<u32>, Option<u64>), i64> = HashMap::new();
    for e in events {
        let end = match e.kind {
            Kind::Release => e.t_start_us.unwrap_or(e.t_us),
            Kind::Lost => e.t_us,
            _ => continue,
        };
        ends.entry((e.worker, e.token))
            .and_modify(|t| *t = (*t).min(end))
            .or_insert(end);
    }
    let mut beliefs: Vec<(i64, i64, Option<u32>)> = events
        .iter()
        .filter(|e| e.kind == Kind::Grant)
        .map(|g| {
            let end = ends.get(&(g.worker, g.token)).copied().unwrap_or(run_end);
            (g.t_us, end, g.worker)
        })
        .collect();
    beliefs.sort();
    let mut active: Vec<(i64, i64, Option<u32>)> = Vec::new();
    let mut longest = 0;
    for (start, end, worker) in beliefs {
        active.retain(|&(_, e, _)| e > start);
        for &(_, other_end, other) in &active {
            if other != worker {
                a.overlaps += 1;
                longest = longest.max(other_end.min(end) - start);
            }
        }
        active.push((start, end, worker));
    }
    a.longest_overlap_ms = longest as f64 / 1000.0;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fencelock::FencingToken;

    use super::*;
    use crate::torture::history::{ADMITTED, REFUSED};

    /// Builds histories row by row, numbering them in commit order.
    #[derive(Default)]
    struct H(Vec<Event>);

    impl H {
        fn push(&mut self, mut e: Event) -> &mut Self {
            e.seq = self.0.len() as i64 + 1;
            self.0.push(e);
            self
        }
        fn grant(&mut self, w: u32, token: u64, requested: i64, granted: i64) -> &mut Self {
            self.push(
                Event::new(Kind::Grant, Some(w), Some(FencingToken(token)), granted)
                    .started(requested),
            )
        }
        fn admit(&mut self, w: u32, token: u64, t: i64, ok: bool) -> &mut Self {
            let outcome = if ok { ADMITTED } else { REFUSED };
            self.push(
                Event::new(Kind::Admit, Some(w), Some(FencingToken(token)), t).outcome(outcome),
            )
        }
        fn write(&mut self, w: u32, token: u64, t: i64, read: i64, ok: bool) -> &mut Self {
            let outcome = if ok { ADMITTED } else { REFUSED };
            let mut e = Event::new(Kind::Write, Some(w), Some(FencingToken(token)), t)
                .started(t)
                .outcome(outcome);
            e.value_read = Some(read);
            e.value_written = Some(read + 1);
            self.push(e)
        }
        fn release(&mut self, w: u32, token: u64, t: i64, outcome: &str) -> &mut Self {
            self.push(
                Event::new(Kind::Release, Some(w), Some(FencingToken(token)), t + 1)
                    .started(t)
                    .outcome(outcome),
            )
        }
        fn lost(&mut self, w: u32, token: u64, t: i64) -> &mut Self {
            self.push(
                Event::new(Kind::Lost, Some(w), Some(FencingToken(token)), t).detail("deadline"),
            )
        }
        fn fault(&mut self, kind: &str, w: Option<u32>, from: i64, to: i64) -> &mut Self {
            self.push(
                Event::new(Kind::Fault, w, None, to)
                    .started(from)
                    .detail(kind),
            )
        }
        /// One clean cycle: grant, admit, write, release.
        fn cycle(&mut self, w: u32, token: u64, t: i64, read: i64) -> &mut Self {
            self.grant(w, token, t, t + 1)
                .admit(w, token, t + 2, true)
                .write(w, token, t + 3, read, true)
                .release(w, token, t + 4, "ok")
        }
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let mut h = H::default();
        h.cycle(0, 1, 0, 0).cycle(1, 2, 10, 1).cycle(0, 3, 20, 2);
        let a = check(&h.0, 3);
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!((a.grants, a.writes_admitted, a.overlaps), (3, 3, 0));
    }

    /// The paused holder (token 1) resumes after token 2 was admitted and
    /// wrote: the fence refused its write, so nothing is violated; the two
    /// beliefs overlapped once.
    #[test]
    fn a_refused_stale_write_is_counted_not_flagged() {
        let mut h = H::default();
        h.grant(0, 1, 0, 1)
            .admit(0, 1, 2, true)
            .fault("pause", Some(0), 3, 100)
            .grant(1, 2, 5, 50)
            .admit(1, 2, 51, true)
            .write(1, 2, 52, 0, true)
            .release(1, 2, 53, "ok")
            .lost(0, 1, 101)
            .write(0, 1, 102, 0, false)
            .release(0, 1, 103, "not-held");
        let a = check(&h.0, 1);
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!(a.writes_refused, 1);
        assert_eq!(a.overlaps, 1);
        assert_eq!(a.longest_overlap_ms, 0.003);
        assert_eq!(a.locks_lost, 1);
        assert_eq!(a.releases_not_held, 1);
        assert_eq!(a.faults.get("pause"), Some(&1));
        assert_eq!(a.fault_count(), 1);
    }

    #[test]
    fn an_admitted_write_below_an_admitted_token_is_a_stale_write() {
        let mut h = H::default();
        h.grant(0, 1, 0, 1)
            .admit(0, 1, 2, true)
            .grant(1, 2, 5, 50)
            .admit(1, 2, 51, true)
            // A broken fence let token 1 through after token 2.
            .write(0, 1, 60, 0, true);
        let a = check(&h.0, 1);
        assert_eq!(a.stale_writes.count, 1, "{a:#?}");
        assert_eq!(a.stale_writes.examples[0].events.len(), 2);
        assert_eq!(a.lost_updates.count, 0);
        assert_eq!(a.violations(), 1);
    }

    /// The unfenced interleaving: both read 0, both write 1.
    #[test]
    fn a_write_that_read_a_superseded_value_is_a_lost_update() {
        let mut h = H::default();
        h.grant(0, 1, 0, 1)
            .push(read(0, 1, 2, 0))
            .grant(1, 2, 5, 50)
            .push(read(1, 2, 51, 0))
            .write(1, 2, 52, 0, true)
            .write(0, 1, 60, 0, true);
        let a = check(&h.0, 1);
        assert_eq!(a.lost_updates.count, 1, "{a:#?}");
        assert_eq!(a.counter_mismatch.count, 1);
        // Unfenced, token 1's write also went in after token 2's.
        assert_eq!(a.stale_writes.count, 1);
        assert_eq!(a.violations(), 3);
    }

    fn read(w: u32, token: u64, t: i64, value: i64) -> Event {
        let mut e = Event::new(Kind::Read, Some(w), Some(FencingToken(token)), t);
        e.value_read = Some(value);
        e
    }

    #[test]
    fn a_final_counter_off_the_admitted_increments_is_flagged() {
        let mut h = H::default();
        h.cycle(0, 1, 0, 0).cycle(1, 2, 10, 1);
        let a = check(&h.0, 5);
        assert_eq!(a.counter_mismatch.count, 1);
        assert_eq!(a.lost_updates.count, 0);
        assert_eq!(a.violations(), 1);
    }

    #[test]
    fn a_lost_update_in_the_first_write_is_flagged() {
        let mut h = H::default();
        h.cycle(0, 1, 0, 7);
        assert_eq!(check(&h.0, 8).lost_updates.count, 1);
    }

    #[test]
    fn a_token_not_above_an_earlier_completed_grant_is_a_regression() {
        let mut h = H::default();
        // Token 5 was granted at 10; worker 1 asked at 20 and got 5 again,
        // worker 2 asked at 30 and got 3.
        h.cycle(0, 5, 9, 0).cycle(1, 5, 20, 1).cycle(2, 3, 30, 2);
        let a = check(&h.0, 3);
        assert_eq!(a.token_regressions.count, 2, "{a:#?}");
        assert_eq!(a.violations(), 2 + 1 /* token 3 wrote after 5 */);
    }

    /// Two acquires in flight at once may complete in either order: only a
    /// grant that completed before the other was requested orders them.
    #[test]
    fn concurrent_grants_are_not_ordered() {
        let mut h = H::default();
        h.grant(0, 7, 0, 30).grant(1, 6, 10, 20);
        assert_eq!(check(&h.0, 0).token_regressions.count, 0);
    }

    #[test]
    fn overlaps_count_pairs_of_workers_and_end_at_the_first_of_release_and_loss() {
        let mut h = H::default();
        h.grant(0, 1, 0, 0)
            .lost(0, 1, 40)
            .release(0, 1, 90, "not-held")
            .grant(1, 2, 0, 30)
            .release(1, 2, 60, "ok")
            // Starts as worker 0's belief ended: no overlap with it.
            .grant(2, 3, 0, 40)
            .release(2, 3, 45, "ok")
            // Worker 1 again, after its own release: no overlap with itself.
            .grant(1, 4, 61, 62)
            .release(1, 4, 63, "ok");
        let a = check(&h.0, 0);
        // (0,1) 30..40 and (1,2)/(2,3) 40..45.
        assert_eq!(a.overlaps, 2, "{a:#?}");
        assert_eq!(a.longest_overlap_ms, 0.010);
    }

    #[test]
    fn a_belief_without_an_end_lasts_until_the_run_ends() {
        let mut h = H::default();
        h.grant(0, 1, 0, 0)
            .grant(1, 2, 0, 100)
            .release(1, 2, 200, "ok");
        assert_eq!(check(&h.0, 0).overlaps, 1);
    }
}
