//! The renewer: one scheduler per [`crate::LockClient`] that renews every
//! lease the client holds and declares loss when a lease's local deadline
//! passes.
//!
//! A task per held lock costs memory, a timer and a wake-up per release; a
//! client holding 100,000 locks would run 100,000 tasks. Instead each client
//! keeps one deadline-ordered schedule:
//!
//! - each registered guard has one timer: its next renewal, or its local
//!   deadline (I5) while a renewal is in flight or when it does not renew;
//! - when a renewal comes due, every other renewal due within a tenth of its
//!   own period (at most [`MAX_BATCH_WINDOW`]) joins it, and the batch goes
//!   to the backend as one [`Backend::renew_many`] call in a task of its
//!   own, so that a hung call delays no other batch and no deadline;
//! - a guard whose deadline passes before a renewal is confirmed is lost;
//!   its lease is never trusted past `t_sent + ttl·(1−drift) − margin`.
//!
//! The scheduler task starts with the client's first guard and ends when the
//! client is dropped and holds none; in between an idle client's task sleeps
//! with nothing to wake for, so a lock cycle spawns no task. Taking a lock
//! wakes the task only if its first timer is earlier than the task's next
//! look, and releasing one only removes its timer; a look planned for a
//! timer that is gone still happens, so that the next lock's timer (later)
//! needs no wake-up either.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    time::Duration,
};

use rand::Rng;
use tokio::{sync::Notify, time::Instant};

use crate::{
    backend::{each_answered, Backend, Renewal},
    backoff::Backoff,
    clock::{suspends, Sent},
    error::{Error, LossReason},
    lease::Shared,
    metrics as m,
};

/// Each renewal comes due up to this fraction of its period early, chosen at
/// random, so that the clients of one backend do not renew in lockstep; and
/// a renewal due within this fraction of its period joins the batch being
/// sent. Renewing a lease a little early costs nothing; it turns thousands
/// of renewals a second into a few round trips.
const EARLY: f64 = 0.1;
/// The longest a renewal is sent ahead of its time to join a batch.
const MAX_BATCH_WINDOW: Duration = Duration::from_secs(1);
/// Most leases in one `renew_many` call, to bound statement and reply size.
const MAX_BATCH: usize = 1_000;

/// One client's schedule. Cheap to clone; clones share it.
#[derive(Clone, Default)]
pub(crate) struct Renewer {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    schedule: Mutex<Schedule>,
    /// Wakes the task when a timer earlier than the one it sleeps for was
    /// added.
    wake: Notify,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Schedule {
    /// By guard id. The ids are the client's own counter, not input, so
    /// the hash need not resist flooding; several lookups per renewal made
    /// the default SipHash show in profiles of clients holding many locks.
    entries: HashMap<u64, Entry, foldhash::fast::RandomState>,
    /// `(when, guard id)`: each entry's one timer.
    timers: BTreeSet<(Instant, u64)>,
    running: bool,
    closed: bool,
    /// The client (every clone of it) is gone: the task ends once the
    /// last guard is.
    client_gone: bool,
    /// When the sleeping task will next look; `None` while it has nothing
    /// to wake for. A timer later than this needs no wake-up: the task
    /// sees it when it looks.
    sleeps_until: Option<Instant>,
}

struct Entry {
    shared: Arc<Shared>,
    /// When the next renewal is due; `None` while one is in flight, or for
    /// a guard that does not renew.
    next_renewal: Option<Instant>,
    timer: Instant,
    /// Paces retries after failed renewals; made at the first failure and
    /// dropped at the next success, as most leases never need one (an
    /// entry is kept per held lock, so its size counts).
    backoff: Option<Box<Backoff>>,
}

impl Entry {
    /// The timer this entry needs: its renewal if one is due, else its
    /// deadline.
    fn wanted_timer(&self) -> Instant {
        let deadline = self.shared.deadline();
        self.next_renewal.map_or(deadline, |r| r.min(deadline))
    }
}

impl Schedule {
    /// Whether the task must be woken to see a timer at `at`; records that
    /// it will look by then.
    fn wake_for(&mut self, at: Instant) -> bool {
        if self.sleeps_until.is_some_and(|s| s <= at) {
            return false;
        }
        self.sleeps_until = Some(at);
        true
    }

    fn set_timer(&mut self, id: u64) -> Option<Instant> {
        let entry = self.entries.get_mut(&id)?;
        self.timers.remove(&(entry.timer, id));
        entry.timer = entry.wanted_timer();
        self.timers.insert((entry.timer, id));
        Some(entry.timer)
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.timers.remove(&(entry.timer, id));
        Some(entry)
    }
}

/// The next renewal of a lease confirmed by a request sent at `sent`:
/// `period` later, less up to a tenth of it at random.
fn jittered(sent: Instant, period: Duration) -> Instant {
    let early = period.mul_f64(rand::thread_rng().gen_range(0.0..EARLY));
    sent + period.saturating_sub(early)
}

/// How early a renewal of `period` may go to join a batch.
fn batch_window(period: Option<Duration>) -> Duration {
    period.map_or(Duration::ZERO, |p| p.mul_f64(EARLY).min(MAX_BATCH_WINDOW))
}

impl Renewer {
    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        // Every update below leaves the schedule consistent between
        // statements, so a panic elsewhere cannot leave it half-written.
        self.inner
            .schedule
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh id for a guard about to register.
    pub(crate) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether [`Renewer::close`] has run.
    pub(crate) fn is_closed(&self) -> bool {
        self.schedule().closed
    }

    /// Starts renewing `shared` every [`Shared::renew_period`] (if any) and watching
    /// its deadline; `false` (and nothing registered) once the client is
    /// closed. Must be called on a tokio runtime.
    pub(crate) fn register(&self, shared: Arc<Shared>) -> bool {
        let id = shared.id;
        let now = Instant::now();
        let entry = Entry {
            next_renewal: shared.renew_period().map(|period| jittered(now, period)),
            backoff: None,
            timer: now,
            shared,
        };
        let mut schedule = self.schedule();
        if schedule.closed {
            return false;
        }
        let timer = entry.wanted_timer();
        schedule.entries.insert(id, Entry { timer, ..entry });
        schedule.timers.insert((timer, id));
        if !schedule.running {
            schedule.running = true;
            schedule.sleeps_until = Some(timer);
            drop(schedule);
            tokio::spawn(run(self.clone()));
        } else if schedule.wake_for(timer) {
            drop(schedule);
            self.inner.wake.notify_one();
        }
        true
    }

    /// Stops renewing guard `id` (released, dropped or detached). Does not
    /// wake the task (at worst it wakes once for a timer that is gone),
    /// unless it may end: the client is gone and this was its last guard.
    pub(crate) fn deregister(&self, id: u64) {
        let mut schedule = self.schedule();
        schedule.remove(id);
        if schedule.client_gone && schedule.entries.is_empty() {
            drop(schedule);
            self.inner.wake.notify_one();
        }
    }

    /// The client and all its clones were dropped: the task ends once the
    /// guards that outlive the client are gone.
    pub(crate) fn client_dropped(&self) {
        self.schedule().client_gone = true;
        self.inner.wake.notify_one();
    }

    /// Takes every registered guard out of the schedule and refuses new
    /// ones; the caller releases them.
    pub(crate) fn close(&self) -> Vec<Arc<Shared>> {
        let mut schedule = self.schedule();
        schedule.closed = true;
        schedule.timers.clear();
        let taken = schedule.entries.drain().map(|(_, e)| e.shared).collect();
        drop(schedule);
        self.inner.wake.notify_one();
        taken
    }

    /// Collects what is due now: the guards whose deadline has passed, and a
    /// batch of renewals. Returns when the task should look again.
    fn due(&self, now: Instant) -> Due {
        let mut schedule = self.schedule();
        // An idle client keeps its task (sleeping, with nothing to wake for)
        // so that a lock cycle costs no task spawn.
        if schedule.entries.is_empty() && (schedule.client_gone || schedule.closed) {
            schedule.running = false;
            return Due::Idle;
        }
        let mut lost = Vec::new();
        let mut batch = Vec::new();
        // Every timer that has come, and at most a batch of those about to:
        // a client with 100,000 leases must not walk a second's worth of
        // timers at each wake-up.
        let mut upcoming = 0;
        let candidates: Vec<(Instant, u64)> = schedule
            .timers
            .range(..=(now + MAX_BATCH_WINDOW, u64::MAX))
            .take_while(|(at, _)| {
                upcoming += usize::from(*at > now);
                upcoming <= MAX_BATCH
            })
            .copied()
            .collect();
        for (at, id) in candidates {
            let Some(entry) = schedule.entries.get_mut(&id) else {
                continue;
            };
            if now >= entry.shared.deadline() {
                if let Some(entry) = schedule.remove(id) {
                    lost.push(entry.shared);
                }
                continue;
            }
            let window = batch_window(entry.shared.renew_period());
            let renewal_due = entry.next_renewal.is_some_and(|r| r <= now + window);
            if renewal_due && batch.len() < MAX_BATCH {
                entry.next_renewal = None;
                batch.push(Arc::clone(&entry.shared));
                schedule.set_timer(id);
            } else if at <= now {
                // A deadline that moved later (a manual renew), or a
                // renewal that did not fit in this batch: look again.
                schedule.set_timer(id);
            }
        }
        // With no timer left (the guards it was woken for are already
        // released), the task still looks when it had planned to: a client
        // taking and releasing locks in a loop then wakes it about once a
        // renewal period, not once per lock (each wake-up of a second task
        // can make tokio wake another worker thread).
        let next = schedule
            .timers
            .first()
            .map(|(at, _)| *at)
            .or(schedule.sleeps_until.filter(|&planned| planned > now));
        schedule.sleeps_until = next;
        Due::Work { lost, batch, next }
    }

    /// Records the outcomes of one batch: the confirmed renewals under one
    /// lock of the schedule and one metrics update, then each failure.
    fn settle(
        &self,
        batch: &[Arc<Shared>],
        sent: Sent,
        outcomes: Vec<Result<crate::Grant, Error>>,
    ) {
        let Some(first) = batch.first() else { return };
        let backend = first.backend.name();
        let mut failed = Vec::new();
        let mut renewed = 0_u64;
        let mut wake = false;
        {
            let mut schedule = self.schedule();
            for (shared, outcome) in batch.iter().zip(outcomes) {
                let grant = match outcome {
                    Ok(grant) => grant,
                    Err(e) => {
                        failed.push((shared, e));
                        continue;
                    }
                };
                shared.extend(sent, &grant);
                renewed += 1;
                let Some(entry) = schedule.entries.get_mut(&shared.id) else {
                    continue;
                };
                entry.backoff = None;
                entry.next_renewal = shared.renew_period().map(|p| jittered(sent.mono, p));
                if let Some(timer) = schedule.set_timer(shared.id) {
                    wake |= schedule.wake_for(timer);
                }
            }
        }
        if wake {
            self.inner.wake.notify_one();
        }
        if renewed > 0 {
            ::metrics::counter!(m::RENEWALS, "backend" => backend).increment(renewed);
            tracing::trace!(renewed, "renewal batch confirmed");
        }
        if !failed.is_empty() {
            ::metrics::counter!(m::RENEWAL_FAILURES, "backend" => backend)
                .increment(failed.len() as u64);
        }
        for (shared, error) in failed {
            self.failed(shared, error);
        }
    }

    /// Records a renewal of `shared` that the backend refused or did not
    /// answer.
    fn failed(&self, shared: &Arc<Shared>, error: Error) {
        if let Error::NotHeld { .. } = error {
            self.deregister(shared.id);
            shared.declare_lost(LossReason::Refused);
            return;
        }
        if shared.is_lost() {
            // A renewal still in flight when the local deadline passed:
            // the loss has been announced (and acted on: `fencelock run`
            // stops its command), so "retrying while the lease is still
            // trusted" would be false, and would print after the loss.
            self.deregister(shared.id);
            return;
        }
        let remaining = shared.deadline().saturating_duration_since(Instant::now());
        let mut schedule = self.schedule();
        let Some(entry) = schedule.entries.get_mut(&shared.id) else {
            return;
        };
        // One warning per streak of failures: the retries that follow are
        // the same news (a service that is down), and the loss, if it
        // comes, is reported on its own.
        if entry.backoff.is_none() {
            tracing::warn!(
                key = %shared.lease.key, token = %shared.lease.token, %error, ?remaining,
                "renewal failed; retrying with backoff while the lease is still trusted"
            );
        } else {
            tracing::debug!(
                key = %shared.lease.key, token = %shared.lease.token, %error, ?remaining,
                "renewal failed again"
            );
        }
        let ttl = shared.ttl;
        let backoff = entry
            .backoff
            .get_or_insert_with(|| Box::new(Backoff::new(ttl / 100, ttl / 10)));
        entry.next_renewal = Some(Instant::now() + backoff.next_retry());
        if let Some(timer) = schedule.set_timer(shared.id) {
            if schedule.wake_for(timer) {
                drop(schedule);
                self.inner.wake.notify_one();
            }
        }
    }

    /// Every registered guard, for the suspend check.
    fn all(&self) -> Vec<Arc<Shared>> {
        self.schedule()
            .entries
            .values()
            .map(|e| Arc::clone(&e.shared))
            .collect()
    }
}

enum Due {
    /// Nothing registered: the task ends (the next registration starts one).
    Idle,
    Work {
        lost: Vec<Arc<Shared>>,
        batch: Vec<Arc<Shared>>,
        next: Option<Instant>,
    },
}

/// The scheduler task.
async fn run(renewer: Renewer) {
    loop {
        let now = Instant::now();
        let (lost, batch, next) = match renewer.due(now) {
            Due::Idle => return,
            Due::Work { lost, batch, next } => (lost, batch, next),
        };
        for shared in lost {
            shared.declare_lost(LossReason::Deadline);
            tokio::spawn(shared.release_after_loss());
        }
        if !batch.is_empty() {
            tokio::spawn(renew_batch(renewer.clone(), batch));
        }
        tokio::select! {
            biased;
            _ = renewer.inner.wake.notified() => {}
            // Monotonic timers do not run during a suspend; this notices,
            // soon after a resume, that the boot-time clock has left some
            // leases' windows.
            _ = suspends().notified() => {
                for shared in renewer.all() {
                    if !shared.boot_ok() {
                        renewer.deregister(shared.id);
                        shared.declare_lost(LossReason::Deadline);
                        tokio::spawn(shared.release_after_loss());
                    }
                }
            }
            _ = sleep_until_some(next) => {}
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Renews `batch`, readers and writers alike, in one `renew_many` round
/// trip, bounded so that a hung call costs one attempt, not the leases'
/// whole remaining time.
async fn renew_batch(renewer: Renewer, batch: Vec<Arc<Shared>>) {
    let Some(first) = batch.first() else { return };
    let backend: Arc<dyn Backend> = Arc::clone(&first.backend);
    let name = backend.name();
    let bound = batch
        .iter()
        .map(|s| s.renew_bound())
        .min()
        .unwrap_or(Duration::from_millis(1));
    let renewals: Vec<Renewal> = batch
        .iter()
        .map(|s| Renewal::new(s.lease.clone(), s.ttl).answered_within(bound))
        .collect();
    let sent = Sent::now();
    let call = backend.renew_many(&renewals);
    let answer = tokio::time::timeout(bound, call).await;
    // One sample per lease: each waited the batch's round trip.
    ::metrics::histogram!(m::RENEW_SECONDS, "backend" => name)
        .record_many(sent.mono.elapsed().as_secs_f64(), batch.len());
    let outcomes = match answer {
        // A copy of a failed batch's error per lease, as a backend error
        // of `name`.
        Ok(batch_answer) => each_answered(name, batch_answer, batch.len()),
        Err(_) => batch
            .iter()
            .map(|_| {
                Err(Error::OperationTimeout {
                    operation: "renew",
                    after: bound,
                })
            })
            .collect(),
    };
    renewer.settle(&batch, sent, outcomes);
}
