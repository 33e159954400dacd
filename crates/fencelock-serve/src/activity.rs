//! `GET /v1/activity`: what an operator needs beside the lease list
//! (`docs/http.md`, `docs/dashboard.md`): who waits for which key and since
//! when, election standbys, each lease's length and last renewal, renewal
//! failures, a bounded history of losses and fenced-out writes that
//! outlives any one page, per-second counts and wait and hold time
//! distributions over the last minutes.
//!
//! Everything here is what this process saw (its HTTP clients' calls and
//! the events of `/v1/events`), kept in memory: a restarted replica starts
//! empty, and each replica counts its own traffic. Only election standbys
//! waiting beside the service come from the backend, where it keeps a queue
//! of waiters (`FairQueue::queue`, `docs/fairness.md`).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use axum::{
    extract::{Query, State},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use fencelock_core::{LockKey, ELECTION_PREFIX};
use fencelock_http::wire::EventBody;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    api::{page, OP_TIMEOUT},
    auth::Caller,
    error::ApiError,
    Service,
};

/// Losses, refused renewals and fenced-out writes kept, newest first.
pub(crate) const INCIDENTS: usize = 500;
/// Seconds of per-second counts and of wait and hold times kept.
pub(crate) const WINDOW_SECONDS: u64 = 300;
/// Upper bounds (inclusive, in ms) of the wait and hold time buckets; one
/// more bucket counts what is longer.
pub(crate) const BUCKETS_MS: [u64; 16] = [
    1, 5, 10, 50, 100, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 900_000,
    3_600_000,
];
/// Elections whose backend queue one answer lists at most.
const MAX_QUEUED_ELECTIONS: usize = 50;
/// How long a lease note outlives the end its holder was last granted
/// before it is dropped unseen (nobody followed the event stream when the
/// lease ended, so no event said so).
const NOTE_GRACE: Duration = Duration::from_secs(60);
/// The end assumed for a lease whose length this process does not know.
const UNKNOWN_TTL: Duration = Duration::from_secs(300);

/// One second's counts.
#[derive(Clone, Debug)]
struct Second {
    /// Unix time, in seconds.
    at: i64,
    acquired: u64,
    released: u64,
    expired: u64,
    lost: u64,
    fenced_out: u64,
    wait: [u64; BUCKETS_MS.len() + 1],
    hold: [u64; BUCKETS_MS.len() + 1],
}

impl Second {
    fn new(at: i64) -> Self {
        Self {
            at,
            acquired: 0,
            released: 0,
            expired: 0,
            lost: 0,
            fenced_out: 0,
            wait: [0; BUCKETS_MS.len() + 1],
            hold: [0; BUCKETS_MS.len() + 1],
        }
    }
}

/// What this process knows of a lease beyond what the backend stores.
#[derive(Debug)]
struct Note {
    token: u64,
    /// The holder, as stored: a renewal by anyone else is not this lease's.
    owner: String,
    ttl_ms: Option<u64>,
    acquired_at: DateTime<Utc>,
    renewed_at: Option<DateTime<Utc>>,
    renewals: u64,
    renewal_failures: u64,
    last_failure: Option<String>,
    /// When the note may be dropped, on this process's clock.
    ends: Instant,
}

/// An acquisition long-polling through this service.
#[derive(Debug)]
struct Waiter {
    keys: Vec<String>,
    owner: String,
    since: DateTime<Utc>,
    started: Instant,
}

/// A loss, a refused renewal or a fenced-out write.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Incident {
    /// `lost`, `renewal_refused` or `fenced_out`.
    #[serde(rename = "type")]
    kind: String,
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    current: Option<u64>,
    at: DateTime<Utc>,
}

#[derive(Debug, Default)]
struct Record {
    next_waiter: u64,
    waiters: HashMap<u64, Waiter>,
    notes: HashMap<String, Note>,
    incidents: VecDeque<Incident>,
    seconds: VecDeque<Second>,
}

impl Record {
    /// The counts of the current second, dropping those out of the window.
    fn second(&mut self) -> &mut Second {
        let now = Utc::now().timestamp();
        self.trim(now);
        if self.seconds.back().is_none_or(|s| s.at < now) {
            self.seconds.push_back(Second::new(now));
        }
        // Pushed above when missing; a clock stepped back counts into the
        // newest second rather than reordering the window.
        self.seconds
            .back_mut()
            .expect("the current second was just pushed")
    }

    fn trim(&mut self, now: i64) {
        let oldest = now - i64::try_from(WINDOW_SECONDS).unwrap_or(i64::MAX) + 1;
        while self.seconds.front().is_some_and(|s| s.at < oldest) {
            self.seconds.pop_front();
        }
    }

    fn incident(&mut self, incident: Incident) {
        if self.incidents.len() == INCIDENTS {
            self.incidents.pop_back();
        }
        self.incidents.push_front(incident);
    }

    /// A lease of `key` with `token` ended: its hold time is counted once.
    fn ended(&mut self, key: &str, token: u64) {
        if self.notes.get(key).is_some_and(|n| n.token == token) {
            if let Some(note) = self.notes.remove(key) {
                let held = (Utc::now() - note.acquired_at).to_std().unwrap_or_default();
                self.second().hold[bucket(held)] += 1;
            }
        }
    }

    /// Drops notes of leases that ended unseen.
    fn prune(&mut self) {
        let now = Instant::now();
        self.notes.retain(|_, n| n.ends + NOTE_GRACE > now);
    }
}

fn bucket(d: Duration) -> usize {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    BUCKETS_MS
        .iter()
        .position(|&bound| ms <= bound)
        .unwrap_or(BUCKETS_MS.len())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The service's record of activity.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    state: Mutex<Record>,
}

/// Counts an acquisition as waiting while it lives, however it ends (the
/// client may hang up).
pub(crate) struct Waiting<'a> {
    activity: &'a Activity,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.activity.state().waiters.remove(&self.id);
    }
}

impl Activity {
    fn state(&self) -> MutexGuard<'_, Record> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An acquisition of `keys` by `owner` starts waiting.
    pub(crate) fn waiting(&self, keys: Vec<String>, owner: &str) -> Waiting<'_> {
        let mut state = self.state();
        state.next_waiter += 1;
        let id = state.next_waiter;
        state.waiters.insert(
            id,
            Waiter {
                keys,
                owner: owner.to_owned(),
                since: Utc::now(),
                started: Instant::now(),
            },
        );
        Waiting { activity: self, id }
    }

    /// Acquisitions long-polling through this service now.
    pub(crate) fn waiters(&self) -> u64 {
        self.state().waiters.len() as u64
    }

    /// The service granted `key`'s lease `token` for `ttl_ms` after the
    /// request had waited `waited` (readers share a key, so only a
    /// writer's lease gets a note).
    pub(crate) fn granted(
        &self,
        key: &str,
        owner: &str,
        token: u64,
        ttl_ms: u64,
        waited: Duration,
        shared: bool,
    ) {
        let mut state = self.state();
        state.second().wait[bucket(waited)] += 1;
        if shared {
            return;
        }
        let ends = Instant::now() + Duration::from_millis(ttl_ms);
        match state.notes.get_mut(key) {
            Some(note) if note.token == token => {
                note.ttl_ms = Some(ttl_ms);
                note.ends = ends;
            }
            _ => {
                state.notes.insert(
                    key.to_owned(),
                    Note {
                        token,
                        owner: owner.to_owned(),
                        ttl_ms: Some(ttl_ms),
                        acquired_at: Utc::now(),
                        renewed_at: None,
                        renewals: 0,
                        renewal_failures: 0,
                        last_failure: None,
                        ends,
                    },
                );
            }
        }
    }

    /// A renewal of `key`'s lease `token` by `owner` through the service:
    /// `Ok(ttl)` renewed, `Err(code)` failed with that error code (a
    /// `not_held` refusal ends the caller's lock: an incident). A renewal
    /// that names the token of a lease this process knows with another
    /// owner is a stranger's: it changes nothing of that lease's record,
    /// and is no one's loss (the caller held nothing).
    pub(crate) fn renewal(
        &self,
        key: &str,
        owner: &str,
        token: u64,
        outcome: Result<Duration, &str>,
    ) {
        let mut state = self.state();
        if state
            .notes
            .get(key)
            .is_some_and(|n| n.token == token && n.owner != owner)
        {
            return;
        }
        let note = state.notes.get_mut(key).filter(|n| n.token == token);
        match (outcome, note) {
            (Ok(ttl), Some(note)) => {
                note.renewed_at = Some(Utc::now());
                note.renewals += 1;
                note.ttl_ms = Some(ms(ttl));
                note.ends = Instant::now() + ttl;
            }
            (Ok(ttl), None) => {
                // A lease granted before this process started, or beside it.
                state.notes.insert(
                    key.to_owned(),
                    Note {
                        token,
                        owner: owner.to_owned(),
                        ttl_ms: Some(ms(ttl)),
                        acquired_at: Utc::now(),
                        renewed_at: Some(Utc::now()),
                        renewals: 1,
                        renewal_failures: 0,
                        last_failure: None,
                        ends: Instant::now() + ttl,
                    },
                );
            }
            (Err(code), note) => {
                if let Some(note) = note {
                    note.renewal_failures += 1;
                    note.last_failure = Some(code.to_owned());
                }
                if code == "not_held" {
                    state.second().lost += 1;
                    state.incident(Incident {
                        kind: "renewal_refused".to_owned(),
                        key: key.to_owned(),
                        owner: Some(owner.to_owned()),
                        token,
                        current: None,
                        at: Utc::now(),
                    });
                    state.ended(key, token);
                }
            }
        }
    }

    /// An event of `/v1/events` (every one passes here once).
    pub(crate) fn record(&self, event: &EventBody) {
        let mut state = self.state();
        match event.kind.as_str() {
            "acquired" => {
                state.second().acquired += 1;
                if state
                    .notes
                    .get(&event.key)
                    .is_none_or(|n| n.token != event.token)
                {
                    // Seen by the listing: the backend says when it began.
                    let (acquired_at, left) =
                        event.lock.as_ref().map_or((event.at, UNKNOWN_TTL), |l| {
                            (l.info.acquired_at, l.info.expires_in)
                        });
                    state.notes.insert(
                        event.key.clone(),
                        Note {
                            token: event.token,
                            owner: event.owner.clone().unwrap_or_default(),
                            ttl_ms: event.lock.as_ref().and_then(|l| l.ttl_ms),
                            acquired_at,
                            renewed_at: None,
                            renewals: 0,
                            renewal_failures: 0,
                            last_failure: None,
                            ends: Instant::now() + left,
                        },
                    );
                }
            }
            kind @ ("released" | "expired" | "lost") => {
                let second = state.second();
                match kind {
                    "released" => second.released += 1,
                    "expired" => second.expired += 1,
                    _ => second.lost += 1,
                }
                if kind == "lost" {
                    state.incident(incident(event));
                }
                state.ended(&event.key, event.token);
            }
            "fenced_out" => {
                state.second().fenced_out += 1;
                state.incident(incident(event));
            }
            _ => {}
        }
    }
}

fn incident(event: &EventBody) -> Incident {
    Incident {
        kind: event.kind.clone(),
        key: event.key.clone(),
        owner: event.owner.clone(),
        token: event.token,
        current: event.current,
        at: event.at,
    }
}

/// `GET /v1/activity`.
#[derive(Debug, Serialize)]
pub(crate) struct ActivityBody {
    /// When this answer was made (the service's clock).
    at: DateTime<Utc>,
    /// How many acquisitions long-poll through this service (a multi-key
    /// one counts once), as `/v1/stats` `waiters` counts them.
    waiting: u64,
    /// Acquisitions long-polling through this service, per key, the
    /// longest waiting first.
    waiters: Vec<KeyWaiters>,
    /// Leases this process granted, renewed or saw granted, by key.
    leases: Vec<LeaseNote>,
    /// Elections with a leader or a standby, and their standbys.
    elections: Vec<ElectionBody>,
    /// Whether the backend keeps a queue of waiters, so that standbys
    /// waiting beside this service are listed too.
    backend_queue: bool,
    /// Losses, refused renewals and fenced-out writes, newest first.
    incidents: Vec<Incident>,
    /// Counts per second over the window, oldest first.
    rates: Rates,
    /// With `limit`: the `after` of the next page of `leases`, `null` on
    /// the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<Option<String>>,
    /// Time acquisitions granted through the service waited, over the window.
    wait_ms: Histogram,
    /// How long leases were held, from grant to release, expiry or loss,
    /// over the window.
    hold_ms: Histogram,
}

#[derive(Debug, Serialize)]
struct KeyWaiters {
    key: String,
    count: usize,
    longest_ms: u64,
    /// Each waiter, the longest waiting first.
    waiting: Vec<WaiterBody>,
}

#[derive(Clone, Debug, Serialize)]
struct WaiterBody {
    owner: String,
    since: DateTime<Utc>,
    waited_ms: u64,
}

#[derive(Debug, Serialize)]
struct LeaseNote {
    key: String,
    token: u64,
    ttl_ms: Option<u64>,
    acquired_at: DateTime<Utc>,
    renewed_at: Option<DateTime<Utc>>,
    renewals: u64,
    renewal_failures: u64,
    last_failure: Option<String>,
}

#[derive(Debug, Serialize)]
struct ElectionBody {
    election: String,
    key: String,
    standbys: Vec<StandbyBody>,
}

#[derive(Debug, Serialize)]
struct StandbyBody {
    owner: String,
    /// `service` (long-polling through this service) or `queue` (listed in
    /// the backend's queue of the key).
    source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    waited_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Rates {
    /// Unix time of the first second.
    from: i64,
    acquired: Vec<u64>,
    released: Vec<u64>,
    expired: Vec<u64>,
    lost: Vec<u64>,
    fenced_out: Vec<u64>,
}

#[derive(Debug, Serialize)]
struct Histogram {
    /// Inclusive upper bounds of the buckets; `counts` has one more, for
    /// longer times.
    bounds_ms: &'static [u64],
    counts: Vec<u64>,
}

/// What the activity state shows, before the backend is asked for queues.
fn snapshot(activity: &Activity, caller: &Caller) -> ActivityBody {
    let mut state = activity.state();
    state.prune();
    let now = Utc::now().timestamp();
    state.trim(now);
    let waiting = state.waiters.len() as u64;
    let mut per_key: BTreeMap<&str, Vec<WaiterBody>> = BTreeMap::new();
    for w in state.waiters.values() {
        let body = WaiterBody {
            owner: caller.owner_out(&w.owner),
            since: w.since,
            waited_ms: ms(w.started.elapsed()),
        };
        for key in &w.keys {
            per_key.entry(key).or_default().push(body.clone());
        }
    }
    let mut waiters: Vec<KeyWaiters> = per_key
        .into_iter()
        .map(|(key, mut waiting)| {
            waiting.sort_by_key(|w| std::cmp::Reverse(w.waited_ms));
            KeyWaiters {
                key: key.to_owned(),
                count: waiting.len(),
                longest_ms: waiting.first().map_or(0, |w| w.waited_ms),
                waiting,
            }
        })
        .collect();
    waiters.sort_by(|a, b| b.longest_ms.cmp(&a.longest_ms).then(a.key.cmp(&b.key)));
    let mut leases: Vec<LeaseNote> = state
        .notes
        .iter()
        .map(|(key, n)| LeaseNote {
            key: key.clone(),
            token: n.token,
            ttl_ms: n.ttl_ms,
            acquired_at: n.acquired_at,
            renewed_at: n.renewed_at,
            renewals: n.renewals,
            renewal_failures: n.renewal_failures,
            last_failure: n.last_failure.clone(),
        })
        .collect();
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    let from = now - i64::try_from(WINDOW_SECONDS).unwrap_or(i64::MAX) + 1;
    let len = usize::try_from(WINDOW_SECONDS).unwrap_or(usize::MAX);
    let mut rates = Rates {
        from,
        acquired: vec![0; len],
        released: vec![0; len],
        expired: vec![0; len],
        lost: vec![0; len],
        fenced_out: vec![0; len],
    };
    let mut wait = vec![0; BUCKETS_MS.len() + 1];
    let mut hold = vec![0; BUCKETS_MS.len() + 1];
    for s in &state.seconds {
        let Some(i) = usize::try_from(s.at - from).ok().filter(|&i| i < len) else {
            continue;
        };
        rates.acquired[i] += s.acquired;
        rates.released[i] += s.released;
        rates.expired[i] += s.expired;
        rates.lost[i] += s.lost;
        rates.fenced_out[i] += s.fenced_out;
        for (total, n) in wait.iter_mut().zip(s.wait) {
            *total += n;
        }
        for (total, n) in hold.iter_mut().zip(s.hold) {
            *total += n;
        }
    }
    let incidents = state
        .incidents
        .iter()
        .map(|i| Incident {
            owner: i.owner.as_deref().map(|o| caller.owner_out(o)),
            ..i.clone()
        })
        .collect();
    ActivityBody {
        at: Utc::now(),
        waiting,
        waiters,
        leases,
        elections: Vec::new(),
        backend_queue: false,
        incidents,
        rates,
        next: None,
        wait_ms: Histogram {
            bounds_ms: &BUCKETS_MS,
            counts: wait,
        },
        hold_ms: Histogram {
            bounds_ms: &BUCKETS_MS,
            counts: hold,
        },
    }
}

/// Paging of `GET /v1/activity`'s tables.
#[derive(Debug, Deserialize)]
pub(crate) struct ActivityQuery {
    /// Most rows of each table: `leases` a page by key (with `next`),
    /// `waiters`, `elections` and `incidents` their first rows (the longest
    /// waits, the newest incidents).
    limit: Option<usize>,
    /// Only leases of keys after this one (the last page's `next`).
    after: Option<String>,
}

/// `GET /v1/activity`: the activity record, with the standbys of every
/// election that has a leader or a waiter (from the backend's queue where
/// it keeps one).
pub(crate) async fn activity(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ActivityQuery>,
) -> Result<Json<ActivityBody>, ApiError> {
    let mut body = snapshot(&s.inner.activity, &caller);
    let leases = std::mem::take(&mut body.leases);
    let (leases, next) = page(leases, |l| l.key.as_str(), q.limit, q.after.as_deref())?;
    body.leases = leases;
    body.next = next;
    if let Some(limit) = q.limit {
        body.waiters.truncate(limit);
        body.incidents.truncate(limit);
    }
    let backend = s.inner.client.backend();
    let leaders = tokio::time::timeout(
        OP_TIMEOUT,
        backend.administer()?.list(Some(ELECTION_PREFIX)),
    )
    .await
    .map_err(|_| {
        ApiError::from(fencelock_core::Error::OperationTimeout {
            operation: "list",
            after: OP_TIMEOUT,
        })
    })??;
    let mut elections: BTreeMap<String, Vec<StandbyBody>> = leaders
        .into_iter()
        .map(|l| (l.key.to_string(), Vec::new()))
        .collect();
    for w in &body.waiters {
        if w.key.starts_with(ELECTION_PREFIX) {
            elections
                .entry(w.key.clone())
                .or_default()
                .extend(w.waiting.iter().map(|w| StandbyBody {
                    owner: w.owner.clone(),
                    source: "service",
                    waited_ms: Some(w.waited_ms),
                }));
        }
    }
    let fair_queue = backend.fair_queue();
    body.backend_queue = fair_queue.is_some();
    if let Some(fair_queue) = fair_queue {
        for (key, standbys) in elections.iter_mut().take(MAX_QUEUED_ELECTIONS) {
            let Ok(lock_key) = LockKey::new(key.as_str()) else {
                continue;
            };
            // A queue that cannot be read leaves the election with the
            // standbys the service knows of.
            let Ok(Ok(queue)) = tokio::time::timeout(OP_TIMEOUT, fair_queue.queue(&lock_key)).await
            else {
                continue;
            };
            for entry in queue {
                let owner = caller.owner_out(entry.owner.as_str());
                if !standbys.iter().any(|s| s.owner == owner) {
                    standbys.push(StandbyBody {
                        owner,
                        source: "queue",
                        waited_ms: None,
                    });
                }
            }
        }
    }
    body.elections = elections
        .into_iter()
        .take(q.limit.unwrap_or(usize::MAX))
        .map(|(key, standbys)| ElectionBody {
            election: key[ELECTION_PREFIX.len()..].to_owned(),
            key,
            standbys,
        })
        .collect();
    Ok(Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_falls_in_the_first_bucket_whose_bound_it_does_not_pass() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_millis(1)), 0);
        assert_eq!(bucket(Duration::from_millis(2)), 1);
        assert_eq!(bucket(Duration::from_secs(1)), 6);
        assert_eq!(bucket(Duration::from_secs(7200)), BUCKETS_MS.len());
    }

    #[test]
    fn failed_renewals_count_on_the_lease_and_a_refusal_ends_it() {
        let activity = Activity::default();
        activity.granted("k", "o", 3, 1_000, Duration::from_millis(7), false);
        activity.renewal("k", "o", 3, Err("unavailable"));
        activity.renewal("k", "o", 3, Ok(Duration::from_secs(2)));
        // Another token's failure is not this lease's.
        activity.renewal("k", "o", 2, Err("unavailable"));
        let body = snapshot(&activity, &Caller::admin());
        let note = &body.leases[0];
        assert_eq!((note.token, note.ttl_ms), (3, Some(2_000)));
        assert_eq!((note.renewals, note.renewal_failures), (1, 1));
        assert_eq!(note.last_failure.as_deref(), Some("unavailable"));
        assert!(note.renewed_at.is_some());
        assert!(body.incidents.is_empty());
        assert_eq!(body.wait_ms.counts[bucket(Duration::from_millis(7))], 1);

        // A stranger naming the lease's token: nothing of the lease changes.
        activity.renewal("k", "stranger", 3, Err("not_held"));
        activity.renewal("k", "stranger", 3, Err("unavailable"));
        let body = snapshot(&activity, &Caller::admin());
        assert_eq!(body.leases[0].renewal_failures, 1);
        assert!(body.incidents.is_empty());
        assert_eq!(body.rates.lost.iter().sum::<u64>(), 0);

        activity.renewal("k", "o", 3, Err("not_held"));
        let body = snapshot(&activity, &Caller::admin());
        assert!(body.leases.is_empty());
        assert_eq!(body.incidents.len(), 1);
        assert_eq!(body.incidents[0].kind, "renewal_refused");
        assert_eq!(body.rates.lost.iter().sum::<u64>(), 1);
        assert_eq!(body.hold_ms.counts.iter().sum::<u64>(), 1);
    }

    #[test]
    fn counts_older_than_the_window_are_dropped() {
        let activity = Activity::default();
        let now = Utc::now().timestamp();
        {
            let mut state = activity.state();
            let window = i64::try_from(WINDOW_SECONDS).unwrap_or(i64::MAX);
            for at in [now - window - 5, now - window, now - 10] {
                let mut second = Second::new(at);
                second.acquired = 1;
                state.seconds.push_back(second);
            }
        }
        let body = snapshot(&activity, &Caller::admin());
        assert_eq!(body.rates.acquired.iter().sum::<u64>(), 1);
        assert_eq!(body.rates.acquired.len() as u64, WINDOW_SECONDS);
    }
}
