//! The checker: a pure function over the recorded history.
//!
//! Every check runs per fenced resource (the lock's counter, a semaphore
//! slot's, a key's of a multi-key lock). Violations (any one fails the run):
//!
//! - **stale write admitted**: an admitted write whose token is below the
//!   fence's floor when it was admitted: for an exclusive holder, a token
//!   admitted (at a read or a write) before it; for a read-write lock's
//!   reader, a *writer's* token admitted before it;
//! - **lost update**: an admitted increment that did not read the value the
//!   previous admitted increment wrote; and, separately, a final counter
//!   that differs from the number of admitted increments;
//! - **token regression**: a grant whose token is not above the token of a
//!   grant that completed before this grant's acquire was requested (I2). The
//!   times are `CLOCK_MONOTONIC`, one clock for every process of the host;
//!
//! and per workload:
//!
//! - semaphore, **too many writers**: more than `permits` admitted writers
//!   at once, a writer counting from the transaction that read its counter
//!   to the one that wrote it (commit order, not clocks);
//! - rwlock, **mode conflict**: an admitted write of a writer with any other
//!   admitted write between its read and its write, or an admitted write of
//!   a reader with a writer's admitted write between its read and its write;
//! - election, **split term**: two grants of one term (two leaders).
//!
//! Also counted: overlaps (two workers' belief intervals on a resource, from
//! the grant to the first of release and noticed loss, intersect, unless
//! both are readers: what the fence made harmless), overlapping *trusted*
//! intervals (from the grant to the first of release called, loss noticed
//! and the guard's own deadline: what I1 and I5 together rule out while
//! the backend keeps its leases), locks lost and noticed, refused writes,
//! faults by kind.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{
    history::{Event, Kind},
    workload::Workload,
};

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

/// What was tortured: the checks that apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The workload.
    pub workload: Workload,
    /// The semaphore's permits (semaphore only).
    pub permits: u32,
}

/// What the history shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Analysis {
    /// Grants (one per key of a multi-key lock).
    pub grants: u64,
    /// Writes attempted.
    pub writes_attempted: u64,
    /// Writes the store took (readers' included).
    pub writes_admitted: u64,
    /// Admitted writes of read-write lock readers (they change no counter).
    pub reader_writes_admitted: u64,
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
    /// Pairs of workers that believed they held a resource at the same
    /// time (not counting two readers).
    pub overlaps: u64,
    /// The longest such overlap, in milliseconds.
    pub longest_overlap_ms: f64,
    /// Holds of one resource that no order of grants explains: a grant
    /// answered before the trusted interval of the hold before it ended
    /// ([`holds`]). Counted, not a violation: a backend that forgets its
    /// leases (a Redis restarted without persistence) makes them by
    /// design, and the fence makes them harmless.
    pub trusted_overlaps: u64,
    /// The most admitted writers at once, counted from each one's read to
    /// its write in commit order, over all resources (a read-write lock's
    /// readers, a multi-key holder's every key, included).
    pub max_concurrent_writers: u64,
    /// Distinct terms (election) or tokens granted.
    pub distinct_tokens: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// The sum of the counters at the end.
    pub final_counter: i64,
    /// Each counter at the end, by resource.
    pub counters: BTreeMap<String, i64>,
    /// Admitted writes with a token below the fence's floor.
    pub stale_writes: Found,
    /// Admitted increments that did not read the previous one's value.
    pub lost_updates: Found,
    /// A final counter other than the number of admitted increments.
    pub counter_mismatch: Found,
    /// Grants whose token did not exceed an earlier completed grant's.
    pub token_regressions: Found,
    /// Semaphore: more admitted writers at once than permits.
    pub too_many_writers: Found,
    /// Read-write lock: an admitted write concurrent with a conflicting one.
    pub mode_conflicts: Found,
    /// Election: two grants of one term.
    pub split_terms: Found,
}

impl Analysis {
    /// All violations.
    pub fn violations(&self) -> u64 {
        self.found().iter().map(|(_, f)| f.count).sum()
    }

    /// Every kind of violation, named as in the report.
    pub fn found(&self) -> [(&'static str, &Found); 7] {
        [
            ("stale writes admitted", &self.stale_writes),
            ("lost updates", &self.lost_updates),
            ("counter mismatch", &self.counter_mismatch),
            ("token regressions", &self.token_regressions),
            ("too many writers", &self.too_many_writers),
            ("mode conflicts", &self.mode_conflicts),
            ("split terms", &self.split_terms),
        ]
    }

    /// Faults injected, all kinds.
    pub fn fault_count(&self) -> u64 {
        self.faults.values().sum()
    }
}

/// Checks `events` (in commit order) and the counters' final values.
pub fn check(spec: Spec, events: &[Event], counters: &BTreeMap<String, i64>) -> Analysis {
    let mut a = Analysis {
        final_counter: counters.values().sum(),
        counters: counters.clone(),
        ..Analysis::default()
    };
    count(events, &mut a);
    let mut by_resource: BTreeMap<&str, Vec<&Event>> =
        counters.keys().map(|r| (r.as_str(), Vec::new())).collect();
    for e in events {
        if let Some(r) = &e.resource {
            by_resource.entry(r).or_default().push(e);
        }
    }
    let run_end = events.iter().map(|e| e.t_us).max().unwrap_or(0);
    for (resource, events) in &by_resource {
        check_writes(resource, events, counters.get(*resource).copied(), &mut a);
        check_tokens(events, &mut a);
        overlaps(events, run_end, &mut a);
        a.trusted_overlaps += trusted_overlaps(&holds(events.iter().copied()));
        if spec.workload == Workload::Rwlock {
            mode_conflicts(events, &mut a);
        }
    }
    concurrency(events, spec, &mut a);
    if spec.workload == Workload::Election {
        split_terms(events, &mut a);
    }
    a
}

fn count(events: &[Event], a: &mut Analysis) {
    let mut tokens = std::collections::HashSet::new();
    for e in events {
        match e.kind {
            Kind::Grant => {
                a.grants += 1;
                tokens.insert((e.resource.as_deref(), e.token));
            }
            Kind::Admit if !e.admitted() => a.admits_refused += 1,
            Kind::Write => {
                a.writes_attempted += 1;
                if e.admitted() {
                    a.writes_admitted += 1;
                    if e.shared {
                        a.reader_writes_admitted += 1;
                    }
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
            Kind::Admit | Kind::Read | Kind::Map | Kind::Trusted => {}
        }
    }
    a.distinct_tokens = tokens.len() as u64;
}

/// Whether `e` is an admitted increment (a writer's, not a reader's).
fn increment(e: &Event) -> bool {
    e.kind == Kind::Write && e.admitted() && !e.shared
}

/// Stale writes and lost updates on one resource, walking its admitted
/// admits and writes in commit order with the fence's two floors.
fn check_writes(resource: &str, events: &[&Event], counter: Option<i64>, a: &mut Analysis) {
    // The highest token admitted in either mode, and the highest writer's.
    let mut highest: Option<&Event> = None;
    let mut writer: Option<&Event> = None;
    let mut previous: Option<&Event> = None;
    let mut increments = 0i64;
    for &e in events.iter().filter(|e| e.admitted()) {
        if e.kind == Kind::Write {
            let floor = if e.shared { writer } else { highest };
            if let Some(h) = floor.filter(|h| h.token > e.token) {
                a.stale_writes.add(
                    format!(
                        "worker {} wrote {resource} with token {} after token {} was admitted",
                        show(e.worker),
                        show(e.token),
                        show(h.token)
                    ),
                    vec![h.clone(), e.clone()],
                );
            }
        }
        if increment(e) {
            increments += 1;
            let expected = previous.and_then(|p| p.value_written).unwrap_or(0);
            if e.value_read != Some(expected) {
                a.lost_updates.add(
                    format!(
                        "worker {} (token {}) read {} from {resource} but the previous \
                         admitted write wrote {expected}",
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
        if !e.shared && writer.is_none_or(|h| e.token > h.token) {
            writer = Some(e);
        }
    }
    let counter = counter.unwrap_or(0);
    if counter != increments {
        a.counter_mismatch.add(
            format!("the final counter of {resource} is {counter} but {increments} increments were admitted"),
            Vec::new(),
        );
    }
}

/// Token regressions on one resource: for each grant, the highest token
/// among the grants that completed before its request was sent must be
/// lower than its own.
fn check_tokens(events: &[&Event], a: &mut Analysis) {
    let mut grants: Vec<&Event> = events
        .iter()
        .copied()
        .filter(|e| e.kind == Kind::Grant)
        .collect();
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

/// Pairs of intersecting belief intervals of different workers on one
/// resource, unless both are readers; a belief without an end lasts until
/// `run_end`.
fn overlaps(events: &[&Event], run_end: i64, a: &mut Analysis) {
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
    let mut beliefs: Vec<(i64, i64, Option<u32>, bool)> = events
        .iter()
        .filter(|e| e.kind == Kind::Grant)
        .map(|g| {
            let end = ends.get(&(g.worker, g.token)).copied().unwrap_or(run_end);
            (g.t_us, end, g.worker, g.shared)
        })
        .collect();
    beliefs.sort();
    let mut active: Vec<(i64, i64, Option<u32>, bool)> = Vec::new();
    let mut longest = 0;
    for (start, end, worker, shared) in beliefs {
        active.retain(|&(_, e, _, _)| e > start);
        for &(_, other_end, other, other_shared) in &active {
            if other != worker && !(shared && other_shared) {
                a.overlaps += 1;
                longest = longest.max(other_end.min(end) - start);
            }
        }
        active.push((start, end, worker, shared));
    }
    a.longest_overlap_ms = a.longest_overlap_ms.max(longest as f64 / 1000.0);
}

/// One exclusive grant with the end of its trusted interval, as the
/// outside checker's mutex sees it: acquired at some instant between its
/// request and its grant, released when its trust ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The resource.
    pub resource: String,
    /// The worker.
    pub worker: Option<u32>,
    /// The grant's token.
    pub token: u64,
    /// Acquire requested, µs.
    pub requested: i64,
    /// Granted, µs.
    pub granted: i64,
    /// The trust ended ([`Kind::Trusted`]), µs.
    pub end: i64,
}

/// The exclusive grants among `events` whose trust end was recorded (a
/// round the run's end cut short has none: when it would have ended is
/// not known, so it is left out). Readers share and hold no mutex.
pub fn holds<'e>(events: impl IntoIterator<Item = &'e Event>) -> Vec<Hold> {
    let events: Vec<&Event> = events.into_iter().collect();
    let key = |e: &Event| (e.worker, e.resource.clone(), e.token);
    let ends: HashMap<_, i64> = events
        .iter()
        .filter(|e| e.kind == Kind::Trusted)
        .map(|e| (key(e), e.t_us))
        .collect();
    events
        .iter()
        .filter(|e| e.kind == Kind::Grant && !e.shared)
        .filter_map(|g| {
            Some(Hold {
                resource: g.resource.clone()?,
                worker: g.worker,
                token: g.token?,
                requested: g.t_start_us.unwrap_or(g.t_us),
                granted: g.t_us,
                end: *ends.get(&key(g))?,
            })
        })
        .collect()
}

/// How many holds of one resource's `holds` a mutex cannot explain. Held
/// intervals of a mutex are disjoint, so they follow in the order of their
/// ends; each can begin once the one before ended and must begin by its
/// grant: one fails iff it was granted before the hold before it ended.
/// This is the verdict the outside checker's linearizability check
/// reaches (zero iff linearizable).
fn trusted_overlaps(holds: &[Hold]) -> u64 {
    let mut by_end: Vec<&Hold> = holds.iter().collect();
    by_end.sort_by_key(|h| h.end);
    by_end
        .windows(2)
        .filter(|pair| pair[1].granted < pair[0].end)
        .count() as u64
}

/// The admitted writes of one resource, each with the read it acted on:
/// the same worker's latest read with the same token before it.
fn admitted_with_reads<'e>(events: &[&'e Event]) -> Vec<(&'e Event, &'e Event)> {
    let mut reads: HashMap<(Option<u32>, Option<u64>), &Event> = HashMap::new();
    let mut pairs = Vec::new();
    for &e in events {
        match e.kind {
            Kind::Read => {
                reads.insert((e.worker, e.token), e);
            }
            Kind::Write if e.admitted() => {
                if let Some(read) = reads.get(&(e.worker, e.token)) {
                    pairs.push((*read, e));
                }
            }
            _ => {}
        }
    }
    pairs
}

/// Read-write lock: between a writer's read and its admitted write no
/// other write may be admitted; between a reader's read and its admitted
/// write no writer's. In commit order, so no clock is involved.
fn mode_conflicts(events: &[&Event], a: &mut Analysis) {
    let pairs = admitted_with_reads(events);
    // Admitted writes in commit order, to find those inside an interval.
    let writes: Vec<&Event> = pairs.iter().map(|&(_, w)| w).collect();
    for &(read, write) in &pairs {
        let from = writes.partition_point(|w| w.seq <= read.seq);
        let to = writes.partition_point(|w| w.seq < write.seq);
        for &other in &writes[from..to] {
            if write.shared && other.shared {
                continue;
            }
            a.mode_conflicts.add(
                format!(
                    "{} {} (token {}) wrote after {} {} (token {}) wrote between its read and its write",
                    role(write),
                    show(write.worker),
                    show(write.token),
                    role(other),
                    show(other.worker),
                    show(other.token)
                ),
                vec![read.clone(), other.clone(), write.clone()],
            );
        }
    }
}

fn role(e: &Event) -> &'static str {
    if e.shared {
        "reader"
    } else {
        "writer"
    }
}

/// The most admitted writers at once over every resource, each from its
/// read to its write in commit order; a semaphore admits at most `permits`.
fn concurrency(events: &[Event], spec: Spec, a: &mut Analysis) {
    let mut by_resource: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        if let Some(r) = &e.resource {
            by_resource.entry(r).or_default().push(e);
        }
    }
    // (seq, +1 at a read, -1 at its write); a write sorts before a read of
    // the same seq, which cannot happen anyway: seqs are unique.
    let mut edges: Vec<(i64, i64, &Event)> = Vec::new();
    for events in by_resource.values() {
        for (read, write) in admitted_with_reads(events) {
            edges.push((read.seq, 1, read));
            edges.push((write.seq, -1, write));
        }
    }
    edges.sort_by_key(|&(seq, delta, _)| (seq, delta));
    let mut open: Vec<&Event> = Vec::new();
    let mut most = 0;
    for (_, delta, e) in edges {
        if delta < 0 {
            open.retain(|r| {
                !(r.worker == e.worker && r.token == e.token && r.resource == e.resource)
            });
            continue;
        }
        open.push(e);
        most = most.max(open.len());
        if spec.workload == Workload::Semaphore && open.len() > spec.permits as usize {
            a.too_many_writers.add(
                format!(
                    "{} admitted writers at once, {} permits: {}",
                    open.len(),
                    spec.permits,
                    open.iter()
                        .map(|r| format!(
                            "worker {} on {} (token {})",
                            show(r.worker),
                            r.resource.as_deref().unwrap_or("?"),
                            show(r.token)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                open.iter().map(|&r| r.clone()).collect(),
            );
        }
    }
    a.max_concurrent_writers = most as u64;
}

/// Election: one leader per term, i.e. no two grants of one token.
fn split_terms(events: &[Event], a: &mut Analysis) {
    let mut seen: HashMap<(Option<&str>, Option<u64>), &Event> = HashMap::new();
    for g in events.iter().filter(|e| e.kind == Kind::Grant) {
        if let Some(first) = seen.insert((g.resource.as_deref(), g.token), g) {
            a.split_terms.add(
                format!(
                    "term {} was granted to worker {} and again to worker {}",
                    show(g.token),
                    show(first.worker),
                    show(g.worker)
                ),
                vec![first.clone(), g.clone()],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fencelock::FencingToken;

    use super::*;
    use crate::torture::history::{ADMITTED, REFUSED, RESOURCE};

    /// The lock workload's check of a history on [`RESOURCE`].
    fn lock(events: &[Event], counter: i64) -> Analysis {
        let spec = Spec {
            workload: Workload::Lock,
            permits: 1,
        };
        check(
            spec,
            events,
            &BTreeMap::from([(RESOURCE.to_owned(), counter)]),
        )
    }

    /// Builds histories row by row, numbering them in commit order; rows
    /// of workers are on [`RESOURCE`] unless [`H::on`] said otherwise.
    #[derive(Default)]
    struct H(Vec<Event>, Option<String>, bool);

    impl H {
        fn push(&mut self, mut e: Event) -> &mut Self {
            e.seq = self.0.len() as i64 + 1;
            if e.token.is_some() {
                e.resource = Some(self.1.clone().unwrap_or_else(|| RESOURCE.to_owned()));
                e.shared = self.2;
                if e.shared {
                    e.value_written = None;
                }
            }
            self.0.push(e);
            self
        }
        /// The rows that follow are on `resource`.
        fn on(&mut self, resource: &str) -> &mut Self {
            self.1 = Some(resource.to_owned());
            self
        }
        /// The rows that follow are a reader's (true) or a writer's.
        fn reader(&mut self, shared: bool) -> &mut Self {
            self.2 = shared;
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
        fn trusted(&mut self, w: u32, token: u64, t: i64) -> &mut Self {
            self.push(Event::new(
                Kind::Trusted,
                Some(w),
                Some(FencingToken(token)),
                t,
            ))
        }
        fn fault(&mut self, kind: &str, w: Option<u32>, from: i64, to: i64) -> &mut Self {
            self.push(
                Event::new(Kind::Fault, w, None, to)
                    .started(from)
                    .detail(kind),
            )
        }
        /// Grant, admit and read `value`.
        fn open(&mut self, w: u32, token: u64, t: i64, value: i64) -> &mut Self {
            self.grant(w, token, t, t + 1)
                .admit(w, token, t + 2, true)
                .push(read(w, token, t + 3, value))
        }
        /// The admitted write of what was read, and the release.
        fn close(&mut self, w: u32, token: u64, t: i64, read: i64) -> &mut Self {
            self.write(w, token, t, read, true)
                .release(w, token, t + 1, "ok")
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
        let a = lock(&h.0, 3);
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
        let a = lock(&h.0, 1);
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
        let a = lock(&h.0, 1);
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
        let a = lock(&h.0, 1);
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
        let a = lock(&h.0, 5);
        assert_eq!(a.counter_mismatch.count, 1);
        assert_eq!(a.lost_updates.count, 0);
        assert_eq!(a.violations(), 1);
    }

    #[test]
    fn a_lost_update_in_the_first_write_is_flagged() {
        let mut h = H::default();
        h.cycle(0, 1, 0, 7);
        assert_eq!(lock(&h.0, 8).lost_updates.count, 1);
    }

    #[test]
    fn a_token_not_above_an_earlier_completed_grant_is_a_regression() {
        let mut h = H::default();
        // Token 5 was granted at 10; worker 1 asked at 20 and got 5 again,
        // worker 2 asked at 30 and got 3.
        h.cycle(0, 5, 9, 0).cycle(1, 5, 20, 1).cycle(2, 3, 30, 2);
        let a = lock(&h.0, 3);
        assert_eq!(a.token_regressions.count, 2, "{a:#?}");
        assert_eq!(a.violations(), 2 + 1 /* token 3 wrote after 5 */);
    }

    /// Two acquires in flight at once may complete in either order: only a
    /// grant that completed before the other was requested orders them.
    #[test]
    fn concurrent_grants_are_not_ordered() {
        let mut h = H::default();
        h.grant(0, 7, 0, 30).grant(1, 6, 10, 20);
        assert_eq!(lock(&h.0, 0).token_regressions.count, 0);
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
        let a = lock(&h.0, 0);
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
        assert_eq!(lock(&h.0, 0).overlaps, 1);
    }

    /// Worker 0 is paused past its deadline (40) and notices only at 90;
    /// worker 1 asked at 10, while 0 held, and was granted at 50.
    #[test]
    fn trusted_intervals_end_at_the_deadline_and_may_follow_a_waiting_request() {
        let mut h = H::default();
        h.grant(0, 1, 0, 5)
            .grant(1, 2, 10, 50)
            .trusted(1, 2, 60)
            .release(1, 2, 60, "ok")
            .lost(0, 1, 90)
            .trusted(0, 1, 40)
            .release(0, 1, 91, "not-held");
        let a = lock(&h.0, 0);
        assert_eq!((a.overlaps, a.trusted_overlaps), (1, 0), "{a:#?}");
    }

    /// Worker 1 granted at 30 while worker 0 trusted until 40: two
    /// holders, with tokens that still increase. A grant without a trust
    /// end (worker 2's, cut short by the run's end) is left out.
    #[test]
    fn a_grant_inside_another_trusted_interval_is_counted() {
        let mut h = H::default();
        h.grant(0, 1, 0, 5)
            .grant(1, 2, 10, 30)
            .trusted(0, 1, 40)
            .release(0, 1, 40, "ok")
            .trusted(1, 2, 50)
            .release(1, 2, 50, "ok")
            .grant(2, 3, 20, 45);
        let a = lock(&h.0, 0);
        assert_eq!((a.trusted_overlaps, a.violations()), (1, 0), "{a:#?}");
        assert_eq!(holds(&h.0).len(), 2);
    }

    fn spec(workload: Workload, permits: u32) -> Spec {
        Spec { workload, permits }
    }

    fn counters(list: &[(&str, i64)]) -> BTreeMap<String, i64> {
        list.iter().map(|&(r, v)| (r.to_owned(), v)).collect()
    }

    /// Two permits of two, each on its own slot, at once: allowed.
    #[test]
    fn semaphore_writers_up_to_the_permits_pass() {
        let mut h = H::default();
        h.on("s-0").open(0, 1, 0, 0).on("s-1").open(1, 1, 0, 0);
        h.on("s-0").close(0, 1, 10, 0).on("s-1").close(1, 1, 10, 0);
        h.on("s-0").open(2, 2, 20, 1).close(2, 2, 30, 1);
        let a = check(
            spec(Workload::Semaphore, 2),
            &h.0,
            &counters(&[("s-0", 2), ("s-1", 1)]),
        );
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!(a.max_concurrent_writers, 2);
    }

    /// A third writer while two permits are in use: a slot beyond the
    /// permits, or a permit the backend granted twice.
    #[test]
    fn semaphore_writers_beyond_the_permits_are_flagged() {
        let mut h = H::default();
        h.on("s-0").open(0, 1, 0, 0).on("s-1").open(1, 1, 0, 0);
        h.on("s-2").open(2, 1, 0, 0);
        h.on("s-0").close(0, 1, 10, 0).on("s-1").close(1, 1, 10, 0);
        h.on("s-2").close(2, 1, 10, 0);
        let a = check(
            spec(Workload::Semaphore, 2),
            &h.0,
            &counters(&[("s-0", 1), ("s-1", 1), ("s-2", 1)]),
        );
        assert_eq!(a.too_many_writers.count, 1, "{a:#?}");
        assert_eq!(a.too_many_writers.examples[0].events.len(), 3);
        assert_eq!(a.max_concurrent_writers, 3);
        assert_eq!(a.violations(), 1);
    }

    /// Per-permit fencing: slot 0's stale holder written after the slot's
    /// next holder was admitted; slot 1 is not affected.
    #[test]
    fn semaphore_a_stale_permit_write_is_flagged_on_its_slot() {
        let mut h = H::default();
        h.on("s-1").open(1, 9, 0, 0).close(1, 9, 5, 0);
        h.on("s-0")
            .open(0, 1, 0, 0)
            .open(2, 2, 50, 0)
            .close(2, 2, 60, 0);
        h.close(0, 1, 70, 1);
        let a = check(
            spec(Workload::Semaphore, 2),
            &h.0,
            &counters(&[("s-0", 2), ("s-1", 1)]),
        );
        assert_eq!(a.stale_writes.count, 1, "{a:#?}");
        assert!(a.stale_writes.examples[0].what.contains("s-0"));
        assert_eq!(a.too_many_writers.count, 0);
    }

    /// Readers of one generation together, then a writer: allowed.
    #[test]
    fn rwlock_readers_together_then_a_writer_pass() {
        let mut h = H::default();
        h.reader(true).open(0, 1, 0, 0).open(1, 2, 1, 0);
        h.close(0, 1, 10, 0).close(1, 2, 11, 0);
        h.reader(false).open(2, 3, 20, 0).close(2, 3, 30, 0);
        h.reader(true).open(0, 4, 40, 1).close(0, 4, 50, 1);
        let a = check(spec(Workload::Rwlock, 1), &h.0, &counters(&[(RESOURCE, 1)]));
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!(a.reader_writes_admitted, 3);
        assert_eq!(a.overlaps, 0, "two readers do not overlap: {a:#?}");
    }

    /// A writer admitted and written while a reader was between its read
    /// and its (admitted) write.
    #[test]
    fn rwlock_a_reader_write_across_a_writer_is_flagged() {
        let mut h = H::default();
        h.reader(true).open(0, 5, 0, 0);
        h.reader(false).open(1, 6, 10, 0).close(1, 6, 20, 0);
        h.reader(true).close(0, 5, 30, 0);
        let a = check(spec(Workload::Rwlock, 1), &h.0, &counters(&[(RESOURCE, 1)]));
        assert_eq!(a.mode_conflicts.count, 1, "{a:#?}");
        assert!(a.mode_conflicts.examples[0].what.starts_with("reader 0"));
        // The reader's token 5 is below writer 6's: the fence's floor.
        assert_eq!(a.stale_writes.count, 1);
        assert_eq!(a.lost_updates.count, 0);
    }

    /// A reader's write admitted while a writer was between its read and
    /// its write: the writer was not alone.
    #[test]
    fn rwlock_a_writer_with_a_reader_inside_is_flagged() {
        let mut h = H::default();
        h.reader(false).open(0, 5, 0, 0);
        h.reader(true).open(1, 6, 10, 0).close(1, 6, 20, 0);
        h.reader(false).close(0, 5, 30, 0);
        let a = check(spec(Workload::Rwlock, 1), &h.0, &counters(&[(RESOURCE, 1)]));
        assert_eq!(a.mode_conflicts.count, 1, "{a:#?}");
        assert!(a.mode_conflicts.examples[0].what.starts_with("writer 0"));
        assert_eq!(a.stale_writes.count, 1);
    }

    #[test]
    fn election_terms_in_order_pass() {
        let mut h = H::default();
        h.cycle(0, 1, 0, 0).cycle(1, 2, 10, 1).cycle(0, 3, 20, 2);
        let a = check(
            spec(Workload::Election, 1),
            &h.0,
            &counters(&[(RESOURCE, 3)]),
        );
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!(a.distinct_tokens, 3);
    }

    /// Two leaders of one term, and a deposed leader's write admitted.
    #[test]
    fn election_two_leaders_of_a_term_and_a_deposed_write_are_flagged() {
        let mut h = H::default();
        h.open(0, 3, 0, 0).open(1, 3, 10, 0);
        h.open(2, 4, 20, 0).close(2, 4, 30, 0).close(0, 3, 40, 1);
        let a = check(
            spec(Workload::Election, 1),
            &h.0,
            &counters(&[(RESOURCE, 2)]),
        );
        assert_eq!(a.split_terms.count, 1, "{a:#?}");
        assert_eq!(a.stale_writes.count, 1);
        // Term 3's second grant came after the first completed.
        assert_eq!(a.token_regressions.count, 1);
        // The same rows under the lock workload: no term check.
        assert_eq!(lock(&h.0, 2).split_terms.count, 0);
    }

    #[test]
    fn multi_keys_each_in_order_pass() {
        let mut h = H::default();
        h.on("k0").open(0, 1, 0, 0).on("k2").open(0, 1, 0, 0);
        h.on("k1").open(1, 1, 0, 0);
        h.on("k0").close(0, 1, 10, 0).on("k2").close(0, 1, 10, 0);
        h.on("k1").close(1, 1, 10, 0);
        h.on("k1").open(0, 2, 20, 1).on("k0").open(0, 2, 20, 1);
        h.on("k1").close(0, 2, 30, 1).on("k0").close(0, 2, 30, 1);
        let a = check(
            spec(Workload::Multi, 1),
            &h.0,
            &counters(&[("k0", 2), ("k1", 2), ("k2", 1)]),
        );
        assert_eq!(a.violations(), 0, "{a:#?}");
        assert_eq!(a.final_counter, 5);
    }

    /// One key of a pair loses an update: flagged on that key alone.
    #[test]
    fn multi_a_lost_update_on_one_key_is_flagged() {
        let mut h = H::default();
        h.on("k0").open(0, 1, 0, 0).on("k1").open(0, 1, 0, 0);
        h.on("k1").open(1, 2, 5, 0).close(1, 2, 6, 0);
        h.on("k0").close(0, 1, 10, 0).on("k1").close(0, 1, 10, 0);
        let a = check(
            spec(Workload::Multi, 1),
            &h.0,
            &counters(&[("k0", 1), ("k1", 1)]),
        );
        assert_eq!(a.lost_updates.count, 1, "{a:#?}");
        assert!(a.lost_updates.examples[0].what.contains("k1"));
        assert_eq!(a.counter_mismatch.count, 1);
        assert!(a.counter_mismatch.examples[0].what.contains("k1"));
        assert_eq!(a.stale_writes.count, 1);
    }
}
