//! `GET /v1/events`: server-sent events of acquisitions, releases, expiries,
//! losses and fenced-out tokens (`docs/http.md`).
//!
//! Two sources feed one broadcast channel. What the service does itself
//! (grants, releases, force-releases, fence refusals) is published at once.
//! What happens elsewhere (clients using the backend directly, and expiries,
//! which no call announces) is found by one task, the follower, while
//! someone follows the stream, and compared with the last view. Both go
//! through one table of known leases, so a change is reported once
//! whichever source sees it first.
//!
//! How the follower finds changes depends on the backend:
//! - One that notifies (`Backend::changes`: PostgreSQL NOTIFY, Redis
//!   pub/sub, an etcd or ZooKeeper watch) names each key a grant or release
//!   touched, whoever made it;
//!   the follower reads those keys only. Expiries and renewals are not
//!   announced, so it also reads, every [`EXPIRY_TICK`], the keys whose
//!   known lease should have ended by then: gone, the lease expired; still
//!   there (renewed by a client of the backend), its known end moves on. A
//!   full listing still runs every [`SAFETY_NET`] (or `--events-interval`
//!   if longer), and at once when the feed says notices were lost: it is
//!   what repairs a notice lost without the feed knowing.
//! - Any other lists the whole backend every `--events-interval`.
//!
//! All of it runs in that one task, one read after the other, so no two
//! views of the backend are applied out of order; the service's own
//! grants and releases, which happen meanwhile, are kept apart by the time
//! they were recorded (`Known::recorded`, `Table::gone_at`).
//!
//! Every event has an SSE id, `<run>-<seq>`: the run names this process's
//! life (a replica restarted, or another replica, has another run) and
//! `seq` counts its events. The last [`BUFFER`] events are kept, so a
//! follower that reconnects with `Last-Event-ID` gets what it missed, in
//! order, before the live events; when that is not possible (another run,
//! an id older than the buffer or unreadable, or a stretch longer than
//! [`REPLAY_WINDOW`] in which nobody followed and changes made elsewhere
//! went unseen) it gets a `resync` event first.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    extract::{Extension, Query, State},
    http::HeaderMap,
    response::sse::{Event, KeepAlive, Sse},
};
use chrono::Utc;
use fencelock_core::{
    Backend, Change, ChangeFeed, FencingToken, LockInfo, LockKey, LockMode, Owner,
};
use fencelock_http::wire::{EventBody, GrantBody, LockBody};
use futures_util::{stream, Stream, StreamExt};
use serde::Deserialize;
use tokio::{
    sync::{broadcast, mpsc, oneshot},
    time::Instant,
};

use crate::{activity::Activity, api::OP_TIMEOUT, Service};

/// Events a slow follower may fall behind by before it is told to resync.
const BUFFER: usize = 1024;

/// A `Last-Event-ID` that is not visible ASCII, as no id of ours is.
const UNREADABLE_ID: &str = "\u{fffd}";

/// How long the service keeps finding changes made elsewhere after the
/// stream's last follower left, so that a follower that reconnects within
/// it (a page reloaded, a network blip, a replica's client moving back) is
/// sent what it missed instead of `resync`.
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(60);

/// How often a backend that notifies is still listed whole. Notices are
/// not acknowledged: one lost without the connection dropping (a server
/// that restarted between two reads, a notice queue that overflowed on the
/// server) is repaired by this listing, so it bounds how long such a
/// change can go unreported, while costing a thirtieth of the default
/// listing's reads of every lease.
pub(crate) const SAFETY_NET: Duration = Duration::from_secs(30);

/// How often, with notices, the keys whose known lease should have ended
/// are read (for expiries, which nobody announces): the most an expiry's
/// event lags behind the backend's, on top of one read.
const EXPIRY_TICK: Duration = Duration::from_millis(200);

/// Keys read at once after notices or at an expiry tick.
const READS_IN_FLIGHT: usize = 64;

/// A lease the event stream has reported.
#[derive(Debug)]
struct Known {
    token: u64,
    owner: String,
    /// No later than when the lease ends, on this process's clock: a lease
    /// that vanished from a listing after this instant expired, before it
    /// was released. Every estimate errs early (clocks started before the
    /// backend call), so an expiry is never reported as a release.
    ends: Instant,
    ttl_ms: Option<u64>,
    /// When this process learned of the lease: a listing asked for before
    /// then is an older view of this key (it may miss a grant the service
    /// just made, or show the lease before it), so it changes nothing here.
    recorded: Instant,
}

impl Known {
    /// How a lease found gone at `seen` ended: `expired` if its end could
    /// have come by then (every estimate of `ends` errs early, so an expiry
    /// is never reported as a release), `released` otherwise.
    fn ended_by(&self, seen: Instant) -> &'static str {
        if self.ends <= seen {
            "expired"
        } else {
            "released"
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    leases: HashMap<String, Known>,
    /// Whether `leases` reflects a listing of the backend; false while
    /// nobody follows the stream (then nothing is tracked).
    seeded: bool,
    /// When the listing last applied was asked for: a listing asked for
    /// earlier is an older view and is dropped, so that two listings
    /// answered out of order never report a change twice or backwards.
    listed_at: Option<Instant>,
    /// When the service itself ended a key's lease lately: a read asked
    /// for before then shows the lease that ended, which is no news. Kept
    /// for [`OP_TIMEOUT`], the age of the oldest read still unanswered.
    gone_at: HashMap<String, Instant>,
}

impl Table {
    /// Whether a view of `key` asked for at `asked` is older than what the
    /// service itself did to the key since.
    fn outdated(&self, key: &str, asked: Instant) -> bool {
        self.gone_at.get(key).is_some_and(|at| asked < *at)
            || self.leases.get(key).is_some_and(|k| k.recorded > asked)
    }

    /// Removes the known lease of `key`, seen gone by a read answered at
    /// `answered`, as the event to report: an expiry when its known end had
    /// passed, else a release (`Known::ends`).
    fn vanished(&mut self, key: &str, answered: Instant) -> Option<EventBody> {
        let known = self.leases.remove(key)?;
        let kind = known.ended_by(answered);
        Some(event(kind, key, Some(known.owner), known.token))
    }

    /// Records a lease a read asked for at `asked` found, the event to
    /// report when it is new.
    fn found(&mut self, key: String, info: LockInfo, asked: Instant) -> Option<EventBody> {
        let ends = asked + info.expires_in;
        match self.leases.get_mut(&key) {
            Some(known) if known.token == info.token.get() => {
                known.ends = ends;
                None
            }
            Some(known) if known.recorded > asked => None,
            _ => {
                let known = Known {
                    token: info.token.get(),
                    owner: info.owner.to_string(),
                    ends,
                    ttl_ms: None,
                    recorded: asked,
                };
                let report = self.seeded.then(|| {
                    let mut e = event("acquired", &key, Some(known.owner.clone()), known.token);
                    e.lock = Some(LockBody { info, ttl_ms: None });
                    e
                });
                self.leases.insert(key, known);
                report
            }
        }
    }
}

/// The events published lately, for followers that reconnect.
#[derive(Debug)]
struct Ring {
    /// The last event's number.
    seq: u64,
    events: VecDeque<(u64, EventBody)>,
    /// Events after this number are complete: the table of known leases
    /// has been compared with every listing since. `u64::MAX` while nobody
    /// follows (changes made elsewhere then go unseen).
    complete_after: u64,
}

/// What a reconnecting follower is sent before the live events.
enum Replay {
    /// A new follower: nothing.
    Nothing,
    /// What it missed, in order.
    Missed(Vec<(u64, EventBody)>),
    /// `resync`: it must reload what it shows.
    Resync,
}

/// The event channel, the table of known leases and the recent events.
#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<(u64, EventBody)>,
    table: Mutex<Table>,
    ring: Mutex<Ring>,
    /// This process's life, the first part of every event id.
    run: String,
    /// Counts every event and keeps losses and fenced-out writes.
    activity: Arc<Activity>,
    /// Asks the follower task to list the backend (and open the change
    /// feed) before a first follower's response head is sent.
    seed: mpsc::Sender<oneshot::Sender<()>>,
    /// The follower task's end of `seed`, taken when it starts.
    seeds: Mutex<Option<mpsc::Receiver<oneshot::Sender<()>>>>,
    /// When a follower last left (or `None`: none has yet), for
    /// [`REPLAY_WINDOW`].
    left_at: Mutex<Option<Instant>>,
}

impl Events {
    pub(crate) fn new(activity: Arc<Activity>) -> Self {
        let (seed, seeds) = mpsc::channel(16);
        Self {
            seed,
            seeds: Mutex::new(Some(seeds)),
            tx: broadcast::channel(BUFFER).0,
            table: Mutex::default(),
            ring: Mutex::new(Ring {
                seq: 0,
                events: VecDeque::with_capacity(BUFFER),
                complete_after: u64::MAX,
            }),
            run: run_id(),
            activity,
            left_at: Mutex::new(None),
        }
    }

    /// Whether nobody has followed the stream for [`REPLAY_WINDOW`]: then
    /// changes made elsewhere are no longer looked for.
    fn unfollowed(&self) -> bool {
        self.tx.receiver_count() == 0
            && self
                .left_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none_or(|at| at.elapsed() >= REPLAY_WINDOW)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, event: EventBody) {
        self.activity.record(&event);
        // Numbered, kept and sent under one lock, so that a follower that
        // subscribes and copies the ring under it misses nothing and sees
        // nothing twice.
        let mut ring = self.ring();
        ring.seq += 1;
        let seq = ring.seq;
        if ring.events.len() == BUFFER {
            ring.events.pop_front();
        }
        ring.events.push_back((seq, event.clone()));
        // No receiver is not an error: nobody follows the stream.
        let _ = self.tx.send((seq, event));
    }

    /// Subscribes a follower that last saw `last_id` (its `Last-Event-ID`),
    /// with what it must be sent first.
    fn subscribe(&self, last_id: Option<&str>) -> (broadcast::Receiver<(u64, EventBody)>, Replay) {
        let ring = self.ring();
        let rx = self.tx.subscribe();
        let Some(last_id) = last_id else {
            return (rx, Replay::Nothing);
        };
        let last = last_id
            .rsplit_once('-')
            .filter(|(run, _)| *run == self.run)
            .and_then(|(_, seq)| seq.parse::<u64>().ok());
        let replay = match last {
            // Everything after `last` is in the ring and was complete.
            Some(last)
                if last <= ring.seq
                    && last >= ring.complete_after
                    && ring
                        .events
                        .front()
                        .is_none_or(|(first, _)| *first <= last + 1) =>
            {
                Replay::Missed(
                    ring.events
                        .iter()
                        .filter(|(seq, _)| *seq > last)
                        .cloned()
                        .collect(),
                )
            }
            _ => Replay::Resync,
        };
        (rx, replay)
    }

    /// The TTL last granted through this service for `key`'s lease `token`.
    pub(crate) fn ttl_ms(&self, key: &str, token: u64) -> Option<u64> {
        self.table()
            .leases
            .get(key)
            .filter(|k| k.token == token)
            .and_then(|k| k.ttl_ms)
    }

    /// The service granted a lease, trusted until `ends` (I5), to a
    /// request with `kind` and `data`.
    pub(crate) fn granted(
        &self,
        grant: &GrantBody,
        ends: Instant,
        kind: Option<String>,
        data: Option<serde_json::Value>,
    ) {
        let mut table = self.table();
        if table
            .leases
            .get(&grant.key)
            .is_some_and(|k| k.token == grant.token)
        {
            return;
        }
        let previous = table.leases.insert(
            grant.key.clone(),
            Known {
                token: grant.token,
                owner: grant.owner.clone(),
                ends,
                ttl_ms: Some(grant.ttl_ms),
                recorded: Instant::now(),
            },
        );
        drop(table);
        // The key's previous lease ended before this grant, unseen (it
        // expired, or was released elsewhere): followers hear of its end
        // before the new holder, as a listing would have told them.
        if let Some(previous) = previous.filter(|p| p.token < grant.token) {
            let kind = previous.ended_by(Instant::now());
            self.publish(event(
                kind,
                &grant.key,
                Some(previous.owner),
                previous.token,
            ));
        }
        let mut acquired = event(
            "acquired",
            &grant.key,
            Some(grant.owner.clone()),
            grant.token,
        );
        acquired.lock = granted_lock(grant, ends, kind, data);
        self.publish(acquired);
    }

    /// The service renewed a lease with a call sent at `sent`: keeps its
    /// end and TTL current.
    pub(crate) fn renewed(&self, grant: &GrantBody, sent: Instant) {
        if let Some(known) = self.table().leases.get_mut(&grant.key) {
            if known.token == grant.token {
                known.ends = sent + Duration::from_millis(grant.ttl_ms);
                known.ttl_ms = Some(grant.ttl_ms);
            }
        }
    }

    /// A lease ended through the service (`released`, or `lost` when
    /// force-released). Always published: a follower waiting for the key
    /// must hear of it even if the listing reported the lease already.
    pub(crate) fn gone(&self, kind: &str, key: &str, owner: Option<&str>, token: u64) {
        {
            let mut table = self.table();
            if table.leases.get(key).is_some_and(|k| k.token == token) {
                table.leases.remove(key);
            }
            if table.seeded {
                table.gone_at.insert(key.to_owned(), Instant::now());
            }
        }
        self.publish(EventBody {
            kind: kind.to_owned(),
            key: key.to_owned(),
            owner: owner.map(str::to_owned),
            token,
            lock: None,
            current: None,
            at: Utc::now(),
        });
    }

    /// An admin reset the fence of `resource` (and its stored value),
    /// which had admitted up to `had`: the audit record of the repair.
    pub(crate) fn reset(&self, resource: &str, had: Option<u64>) {
        self.publish(EventBody {
            kind: "reset".to_owned(),
            key: resource.to_owned(),
            owner: None,
            token: had.unwrap_or(0),
            lock: None,
            current: None,
            at: Utc::now(),
        });
    }

    /// A fence refused `token` at `resource`.
    pub(crate) fn fenced_out(&self, resource: &str, token: u64, current: u64) {
        self.publish(EventBody {
            kind: "fenced_out".to_owned(),
            key: resource.to_owned(),
            owner: None,
            token,
            lock: None,
            current: Some(current),
            at: Utc::now(),
        });
    }

    /// Compares a listing of the backend, asked for at `asked` and answered
    /// by `answered`, with the known leases and publishes the differences.
    fn observe(&self, locks: Vec<fencelock_core::LockInfo>, asked: Instant, answered: Instant) {
        let mut out = Vec::new();
        {
            let mut table = self.table();
            if table.listed_at.is_some_and(|at| asked < at) {
                return;
            }
            table.listed_at = Some(asked);
            let mut current: HashMap<String, fencelock_core::LockInfo> =
                locks.into_iter().map(|l| (l.key.to_string(), l)).collect();
            if table.seeded {
                let gone: Vec<String> = table
                    .leases
                    .iter()
                    .filter(|(key, known)| {
                        known.recorded <= asked
                            && current
                                .get(*key)
                                .is_none_or(|l| l.token.get() != known.token)
                    })
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in gone {
                    out.extend(table.vanished(&key, answered));
                }
            }
            if !table.seeded {
                // What was kept while nobody followed and is gone now ended
                // before anyone could follow it: dropped, not reported.
                table.leases.retain(|key, known| {
                    known.recorded > asked
                        || current
                            .get(key)
                            .is_some_and(|l| l.token.get() == known.token)
                });
            }
            for (key, info) in current.drain() {
                if table.gone_at.get(&key).is_some_and(|at| asked < *at) {
                    continue;
                }
                out.extend(table.found(key, info, asked));
            }
            if !table.seeded {
                // From here on, changes made elsewhere are seen again.
                let mut ring = self.ring();
                ring.complete_after = ring.seq;
            }
            table.seeded = true;
        }
        for e in out {
            self.publish(e);
        }
    }

    /// Compares what reads of single keys, asked for at `asked` and
    /// answered by `answered`, found with the known leases and publishes the
    /// differences.
    fn observe_keys(
        &self,
        found: Vec<(String, Option<LockInfo>)>,
        asked: Instant,
        answered: Instant,
    ) {
        let mut out = Vec::new();
        {
            let mut table = self.table();
            if !table.seeded {
                return;
            }
            for (key, info) in found {
                if table.outdated(&key, asked) {
                    continue;
                }
                match info {
                    Some(info) => {
                        if table
                            .leases
                            .get(&key)
                            .is_some_and(|k| k.token != info.token.get())
                        {
                            out.extend(table.vanished(&key, answered));
                        }
                        out.extend(table.found(key, info, asked));
                    }
                    None => out.extend(table.vanished(&key, answered)),
                }
            }
        }
        for e in out {
            self.publish(e);
        }
    }

    /// The keys whose known lease should have ended by `now`, and drops
    /// the service's own records of ended leases no read can predate.
    fn due(&self, now: Instant) -> Vec<String> {
        let mut table = self.table();
        table
            .gone_at
            .retain(|_, at| now.saturating_duration_since(*at) <= OP_TIMEOUT);
        table
            .leases
            .iter()
            .filter(|(_, k)| k.ends <= now)
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn forget(&self) {
        let now = Instant::now();
        let mut table = self.table();
        // The service's own live grants stay: their TTL is known nowhere
        // else (`GET /v1/locks/{key}` shows it), whether or not anyone
        // follows. The first listing after this drops those it no longer
        // finds, without reporting them.
        table
            .leases
            .retain(|_, k| k.ttl_ms.is_some() && k.ends > now);
        table.gone_at.clear();
        table.seeded = false;
        table.listed_at = None;
        self.ring().complete_after = u64::MAX;
    }

    /// Lists the backend before a first follower's head is sent: the
    /// follower task does it, so that the change feed is open before the
    /// listing (no change falls between them).
    async fn seed(&self) {
        let (done, seeded) = oneshot::channel();
        if self.seed.send(done).await.is_ok() {
            // Dropped unanswered only when the service shuts down.
            let _ = seeded.await;
        }
    }

    /// Reads `keys` one by one, a few at a time, and compares what was found
    /// with the known leases.
    async fn read_keys(&self, backend: &dyn Backend, keys: impl IntoIterator<Item = String>) {
        let asked = Instant::now();
        let found: Vec<(String, Option<LockInfo>)> = stream::iter(keys)
            .map(|key| async move {
                let lock_key = LockKey::new(key.as_str()).ok()?;
                match tokio::time::timeout(OP_TIMEOUT, backend.inspect(&lock_key)).await {
                    Ok(Ok(info)) => Some((key, info)),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, key, "event read failed; the listing will see it");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(key, "event read got no answer; the listing will see it");
                        None
                    }
                }
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await;
        self.observe_keys(found, asked, Instant::now());
    }

    /// Lists the backend and compares the listing with the known leases.
    async fn list(&self, backend: &dyn fencelock_core::Backend) {
        reads(backend, "listing", 1);
        let asked = Instant::now();
        match tokio::time::timeout(OP_TIMEOUT, async { backend.administer()?.list(None).await })
            .await
        {
            Ok(Ok(locks)) => self.observe(locks, asked, Instant::now()),
            Ok(Err(e)) => tracing::debug!(error = %e, "event listing failed; trying again"),
            Err(_) => tracing::debug!("event listing got no answer; trying again"),
        }
    }
}

/// `resync`: the follower missed events and must reload what it shows. It
/// has no id, so a reconnect after it still names the last event seen.
fn resync() -> Event {
    Event::default().event("resync").data("{}")
}

/// A name for this process's life: the start time in nanoseconds and the
/// process id, so a restarted replica and every other replica differ.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}.{:x}", std::process::id())
}

fn event(kind: &str, key: &str, owner: Option<String>, token: u64) -> EventBody {
    EventBody {
        kind: kind.to_owned(),
        key: key.to_owned(),
        owner,
        token,
        lock: None,
        current: None,
        at: Utc::now(),
    }
}

/// The lease the service granted as `GET /v1/locks/{key}` shows it, so that
/// a follower need not read it: the backend keeps the request's kind and
/// data, and the grant's start is its end less the TTL granted, both on the
/// backend's clock. `None` only for a key or owner the backend could not
/// have granted.
fn granted_lock(
    grant: &GrantBody,
    ends: Instant,
    kind: Option<String>,
    data: Option<serde_json::Value>,
) -> Option<LockBody> {
    let ttl = Duration::from_millis(grant.ttl_ms);
    let info = LockInfo {
        key: LockKey::new(grant.key.as_str()).ok()?,
        owner: Owner::new(grant.owner.as_str()).ok()?,
        token: FencingToken(grant.token),
        kind,
        data,
        acquired_at: grant.expires_at - chrono::Duration::from_std(ttl).ok()?,
        expires_at: grant.expires_at,
        expires_in: ends.saturating_duration_since(Instant::now()),
        mode: LockMode::Exclusive,
    };
    Some(LockBody {
        info,
        ttl_ms: Some(grant.ttl_ms),
    })
}

/// Counts `n` reads of the backend from `source`
/// ([`crate::metrics::SERVICE_EVENT_READS`]).
fn reads(backend: &dyn Backend, source: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!(
            crate::metrics::SERVICE_EVENT_READS,
            "backend" => backend.name(),
            "source" => source
        )
        .increment(n as u64);
    }
}

/// The next notice of `feed`, or never without one.
async fn next_change(feed: &mut Option<ChangeFeed>) -> Option<Change> {
    match feed {
        Some(feed) => feed.next().await,
        None => std::future::pending().await,
    }
}

/// Whether the backend notifies: `None` until asked, then whether
/// [`Backend::changes`] answered a feed (an error is asked again at the next
/// listing).
async fn open_feed(backend: &dyn Backend, notifies: &mut Option<bool>) -> Option<ChangeFeed> {
    if *notifies == Some(false) {
        return None;
    }
    match tokio::time::timeout(OP_TIMEOUT, backend.changes()).await {
        Ok(Ok(Some(feed))) => {
            *notifies = Some(true);
            Some(feed)
        }
        Ok(Ok(None)) => {
            *notifies = Some(false);
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "change notices unavailable; listing meanwhile");
            None
        }
        Err(_) => {
            tracing::debug!("change notices got no answer; listing meanwhile");
            None
        }
    }
}

/// The follower task: while the stream has followers, finds the changes
/// made elsewhere (see the module doc), until the service shuts down.
/// `interval` is `--events-interval`; without `notices` the backend is
/// listed every `interval` even if it notifies.
pub(crate) fn spawn_poller(service: &Service, interval: Duration, notices: bool) {
    let service = service.clone();
    let Some(mut seeds) = service
        .inner
        .events
        .seeds
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        return;
    };
    tokio::spawn(async move {
        let inner = &service.inner;
        let events = &inner.events;
        let backend = inner.client.backend();
        let backend = backend.as_ref();
        let mut feed: Option<ChangeFeed> = None;
        let mut notifies: Option<bool> = (!notices).then_some(false);
        let every = |feed: &Option<ChangeFeed>| {
            if feed.is_some() {
                interval.max(SAFETY_NET)
            } else {
                interval
            }
        };
        let mut next_listing = Instant::now() + interval;
        let mut changed: HashSet<String> = HashSet::new();

        // An interval, not a sleep in the select: notices arriving more often
        // than the tick must not postpone it.
        let mut tick = tokio::time::interval(EXPIRY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                seed = seeds.recv() => {
                    let Some(done) = seed else { return };
                    if feed.is_none() {
                        feed = open_feed(backend, &mut notifies).await;
                    }
                    events.list(backend).await;
                    next_listing = Instant::now() + every(&feed);
                    let _ = done.send(());
                }
                _ = tokio::time::sleep_until(next_listing) => {
                    if events.unfollowed() {
                        events.forget();
                        // Notices nobody reads are not received at all.
                        feed = None;
                        next_listing = Instant::now() + interval;
                        continue;
                    }
                    if feed.is_none() {
                        feed = open_feed(backend, &mut notifies).await;
                    }
                    events.list(backend).await;
                    next_listing = Instant::now() + every(&feed);
                }
                change = next_change(&mut feed) => match change {
                    Some(Change::Key(key)) => {
                        let before = changed.len();
                        changed.insert(key);
                        // What arrived meanwhile is read in the same round.
                        while let Some(Some(change)) = feed.as_mut().map(ChangeFeed::try_next) {
                            match change {
                                Change::Key(key) => {
                                    changed.insert(key);
                                }
                                _ => {
                                    next_listing = Instant::now();
                                    break;
                                }
                            }
                        }
                        reads(backend, "notice", changed.len() - before);
                    }
                    Some(_) => next_listing = Instant::now(),
                    // The backend stopped notifying: listing takes over,
                    // and asks for a feed again.
                    None => {
                        feed = None;
                        next_listing = next_listing.min(Instant::now() + interval);
                    }
                },
                _ = tick.tick(), if feed.is_some() => {
                    if events.unfollowed() {
                        events.forget();
                        feed = None;
                        continue;
                    }
                    let due = events.due(Instant::now());
                    reads(backend, "expiry", due.len());
                    changed.extend(due);
                }
            }
            if !changed.is_empty() {
                if events.table().seeded {
                    events.read_keys(backend, changed.drain()).await;
                } else {
                    changed.clear();
                }
            }
        }
    });
}

/// A follower of the stream, while its response lives: when it goes, the
/// replay window starts.
struct Following(Service);

impl Drop for Following {
    fn drop(&mut self) {
        *self
            .0
            .inner
            .events
            .left_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[derive(Deserialize)]
pub(crate) struct EventQuery {
    /// Only events of this key.
    key: Option<String>,
    /// Only events of keys with this prefix.
    prefix: Option<String>,
}

/// `GET /v1/events`. The subscription is taken, and the table of known
/// leases seeded from a listing if nobody followed the stream before, before
/// the response head is sent: a client that has the head sees every later
/// change, including those made outside the service and expiries, which
/// only a comparison with that first listing can reveal.
pub(crate) async fn stream(
    State(service): State<Service>,
    Extension(caller): Extension<crate::auth::Caller>,
    Query(q): Query<EventQuery>,
    headers: HeaderMap,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // An id that is not text cannot be resumed from, but says the follower
    // saw events before: it gets `resync`, not a fresh start.
    let last_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().map_or(UNREADABLE_ID, str::trim));
    let (rx, replay) = service.inner.events.subscribe(last_id);
    if !service.inner.events.table().seeded {
        service.inner.events.seed().await;
    }
    let shutdown = service.inner.shutdown.clone();
    let matches = move |e: &EventBody| {
        q.key.as_deref().is_none_or(|k| e.key == k)
            && q.prefix.as_deref().is_none_or(|p| e.key.starts_with(p))
    };
    let run = service.inner.events.run.clone();
    let sse = move |seq: u64, e: &EventBody| {
        // An event's lease is shown as `GET /v1/locks/{key}` shows it to
        // this caller: owners of its own namespace without it.
        let shown = e
            .lock
            .as_ref()
            .filter(|_| caller.namespace().is_some())
            .map(|lock| {
                let mut e = e.clone();
                e.lock = Some(LockBody {
                    info: crate::api::shown(&caller, lock.info.clone()),
                    ttl_ms: lock.ttl_ms,
                });
                e
            });
        Event::default()
            .id(format!("{run}-{seq}"))
            .event(e.kind.clone())
            .json_data(shown.as_ref().unwrap_or(e))
            .unwrap_or_else(|_| Event::default().event("error"))
    };
    let first: Vec<Event> = match replay {
        Replay::Nothing => Vec::new(),
        Replay::Missed(missed) => missed
            .iter()
            .filter(|(_, e)| matches(e))
            .map(|(seq, e)| sse(*seq, e))
            .collect(),
        Replay::Resync => vec![resync()],
    };
    let following = Following(service.clone());
    let live = stream::unfold(
        (rx, shutdown, following),
        move |(mut rx, shutdown, following)| {
            let matches = matches.clone();
            let sse = sse.clone();
            async move {
                loop {
                    let received = tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        r = rx.recv() => r,
                    };
                    let event = match received {
                        Ok((seq, e)) if matches(&e) => sse(seq, &e),
                        Ok(_) => continue,
                        // Events were dropped: the follower should reload the list.
                        Err(broadcast::error::RecvError::Lagged(_)) => resync(),
                        Err(broadcast::error::RecvError::Closed) => return None,
                    };
                    return Some((Ok(event), (rx, shutdown, following)));
                }
            }
        },
    );
    let events = stream::iter(first.into_iter().map(Ok)).chain(live);
    Sse::new(events).keep_alive(KeepAlive::default())
}
