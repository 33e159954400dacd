//! `GET /v1/events`: server-sent events of acquisitions, releases, expiries,
//! losses and fenced-out tokens (`docs/http.md`).
//!
//! Two sources feed one broadcast channel. What the service does itself
//! (grants, releases, force-releases, fence refusals) is published at once.
//! What happens elsewhere (clients using the backend directly, and expiries,
//! which no call announces) is found by listing the backend every
//! interval while someone follows the stream and comparing with the last
//! view. Both go through one table of known leases, so a change is reported
//! once whichever source sees it first. `Backend::watch` streams one key,
//! not a whole table, so the listing is what covers every backend alike.
//!
//! Every event has an SSE id, `<run>-<seq>`: the run names this process's
//! life (a replica restarted, or another replica, has another run) and
//! `seq` counts its events. The last [`BUFFER`] events are kept, so a
//! follower that reconnects with `Last-Event-ID` gets what it missed, in
//! order, before the live events; when that is not possible (another run,
//! an id older than the buffer, or a stretch in which nobody followed and
//! changes made elsewhere went unseen) it gets a `resync` event first.

use std::{
    collections::{HashMap, VecDeque},
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    extract::{Query, State},
    http::HeaderMap,
    response::sse::{Event, KeepAlive, Sse},
};
use chrono::Utc;
use fencelock_http::wire::{EventBody, GrantBody, LockBody};
use futures_util::{stream, Stream, StreamExt};
use serde::Deserialize;
use tokio::{sync::broadcast, time::Instant};

use crate::{activity::Activity, api::OP_TIMEOUT, Service};

/// Events a slow follower may fall behind by before it is told to resync.
const BUFFER: usize = 1024;

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
}

impl Events {
    pub(crate) fn new(activity: Arc<Activity>) -> Self {
        Self {
            tx: broadcast::channel(BUFFER).0,
            table: Mutex::default(),
            ring: Mutex::new(Ring {
                seq: 0,
                events: VecDeque::with_capacity(BUFFER),
                complete_after: u64::MAX,
            }),
            run: run_id(),
            activity,
        }
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

    /// The service granted a lease, trusted until `ends` (I5).
    pub(crate) fn granted(&self, grant: &GrantBody, ends: Instant) {
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
        self.publish(EventBody {
            kind: "acquired".to_owned(),
            key: grant.key.clone(),
            owner: Some(grant.owner.clone()),
            token: grant.token,
            lock: None,
            current: None,
            at: Utc::now(),
        });
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
                    if let Some(known) = table.leases.remove(&key) {
                        let kind = known.ended_by(answered);
                        out.push(event(kind, &key, Some(known.owner), known.token));
                    }
                }
            }
            for (key, info) in current.drain() {
                let ends = asked + info.expires_in;
                match table.leases.get_mut(&key) {
                    Some(known) if known.token == info.token.get() => known.ends = ends,
                    Some(known) if known.recorded > asked => {}
                    _ => {
                        let known = Known {
                            token: info.token.get(),
                            owner: info.owner.to_string(),
                            ends,
                            ttl_ms: None,
                            recorded: asked,
                        };
                        if table.seeded {
                            let mut e =
                                event("acquired", &key, Some(known.owner.clone()), known.token);
                            e.lock = Some(LockBody { info, ttl_ms: None });
                            out.push(e);
                        }
                        table.leases.insert(key, known);
                    }
                }
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

    fn forget(&self) {
        let mut table = self.table();
        table.leases.clear();
        table.seeded = false;
        table.listed_at = None;
        self.ring().complete_after = u64::MAX;
    }

    /// Lists the backend and compares the listing with the known leases.
    async fn list(&self, backend: &dyn fencelock_core::Backend) {
        let asked = Instant::now();
        match tokio::time::timeout(OP_TIMEOUT, backend.list(None)).await {
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

/// Lists the backend every `interval` while the stream has followers,
/// until the service shuts down.
pub(crate) fn spawn_poller(service: &Service, interval: Duration) {
    let service = service.clone();
    tokio::spawn(async move {
        let inner = &service.inner;
        loop {
            tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            if inner.events.tx.receiver_count() == 0 {
                inner.events.forget();
                continue;
            }
            inner.events.list(inner.client.backend().as_ref()).await;
        }
    });
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
    Query(q): Query<EventQuery>,
    headers: HeaderMap,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let (rx, replay) = service.inner.events.subscribe(last_id);
    if !service.inner.events.table().seeded {
        service
            .inner
            .events
            .list(service.inner.client.backend().as_ref())
            .await;
    }
    let shutdown = service.inner.shutdown.clone();
    let matches = move |e: &EventBody| {
        q.key.as_deref().is_none_or(|k| e.key == k)
            && q.prefix.as_deref().is_none_or(|p| e.key.starts_with(p))
    };
    let run = service.inner.events.run.clone();
    let sse = move |seq: u64, e: &EventBody| {
        Event::default()
            .id(format!("{run}-{seq}"))
            .event(e.kind.clone())
            .json_data(e)
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
    let live = stream::unfold((rx, shutdown), move |(mut rx, shutdown)| {
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
                return Some((Ok(event), (rx, shutdown)));
            }
        }
    });
    let events = stream::iter(first.into_iter().map(Ok)).chain(live);
    Sse::new(events).keep_alive(KeepAlive::default())
}
