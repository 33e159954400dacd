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

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use axum::{
    extract::{Query, State},
    response::sse::{Event, KeepAlive, Sse},
};
use chrono::Utc;
use fencelock_http::wire::{EventBody, GrantBody, LockBody};
use futures_util::{stream, Stream};
use serde::Deserialize;
use tokio::{sync::broadcast, time::Instant};

use crate::{api::OP_TIMEOUT, Service};

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

/// The event channel and the table of known leases.
#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<EventBody>,
    table: Mutex<Table>,
}

impl Events {
    pub(crate) fn new() -> Self {
        Self {
            tx: broadcast::channel(BUFFER).0,
            table: Mutex::default(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, event: EventBody) {
        // No receiver is not an error: nobody follows the stream.
        let _ = self.tx.send(event);
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
        table.leases.insert(
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
                        let kind = if known.ends <= answered {
                            "expired"
                        } else {
                            "released"
                        };
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
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = service.inner.events.tx.subscribe();
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
    let events = stream::unfold((rx, shutdown), move |(mut rx, shutdown)| {
        let matches = matches.clone();
        async move {
            loop {
                let received = tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    r = rx.recv() => r,
                };
                let event = match received {
                    Ok(e) if matches(&e) => Event::default()
                        .event(e.kind.clone())
                        .json_data(&e)
                        .unwrap_or_else(|_| Event::default().event("error")),
                    Ok(_) => continue,
                    // Events were dropped: the follower should reload the list.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        Event::default().event("resync").data("{}")
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                return Some((Ok(event), (rx, shutdown)));
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
