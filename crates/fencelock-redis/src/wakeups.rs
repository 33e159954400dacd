//! Release wake-ups: one pub/sub channel per lock key, subscribed only
//! while this backend has a waiter for that key.
//!
//! A release publishes on its key's channel. With one channel for every
//! key, each release would be delivered to every connected backend, waiter
//! or not, and waking a process's pub/sub reader for nothing cost as much
//! client CPU as the acquire+release itself (measured with `fencelock bench
//! --scenario cycle --baseline`, docs/benchmarks.md). Per-key channels
//! subscribed on demand cost a `PUBLISH` to no one when nobody waits.
//!
//! The same connection carries the store's change notices
//! (`Backend::changes`): every grant and release also publishes its user
//! key on one channel for the whole store (`Keys::changes`), subscribed
//! while a lock service follows its event stream.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fencelock_core::{ChangeFeed, ChangeHub, LockKey, Result, WakeHub, WakeSubscription};
use futures_util::StreamExt;
use redis::{
    aio::{PubSubSink, PubSubStream},
    Client,
};

use crate::{error::map, keys::Keys};

/// The pub/sub connection's command half and the channels it listens on.
#[derive(Default)]
struct Listening {
    sink: Option<PubSubSink>,
    /// User keys whose channel is subscribed.
    keys: HashSet<String>,
    /// Whether the store's change channel is subscribed.
    changes: bool,
}

/// Waiters of this backend and the subscriptions that serve them.
pub(crate) struct Wakeups {
    hub: WakeHub,
    changes: ChangeHub,
    keys: Keys,
    /// Bound of one SUBSCRIBE or UNSUBSCRIBE.
    timeout: Duration,
    /// Bound of opening the pub/sub connection.
    connect_timeout: Duration,
    /// Live waiters per user key.
    waiters: Mutex<HashMap<String, usize>>,
    /// SUBSCRIBE and UNSUBSCRIBE go through this lock one at a time and
    /// re-read `waiters` under it, so they reach the server in an order
    /// that leaves every key with a waiter subscribed.
    listening: tokio::sync::Mutex<Listening>,
}

/// Where a pub/sub connection may go, asked at each (re)connection: the
/// server; in a Redis Cluster one client per listed node, any of which will
/// do (a `PUBLISH` on any node is broadcast to every node's subscribers);
/// through Sentinel the master as last found.
pub(crate) type NodeClients = Arc<dyn Fn() -> Vec<Client> + Send + Sync>;

/// Opens a pub/sub connection within `timeout` (a server that accepts
/// connections but does not answer must not stall us), to the first of
/// `clients` that answers, starting at `*next` and leaving `*next` at the
/// one that did.
async fn open(
    clients: &NodeClients,
    next: &mut usize,
    timeout: Duration,
) -> Result<(PubSubSink, PubSubStream)> {
    let clients = clients();
    let mut last = None;
    for attempt in 0..clients.len() {
        let i = next.wrapping_add(attempt) % clients.len();
        match tokio::time::timeout(timeout, clients[i].get_async_pubsub()).await {
            Ok(Ok(pubsub)) => {
                *next = i;
                return Ok(pubsub.split());
            }
            Ok(Err(e)) => last = Some(map("pub/sub connect", e)),
            Err(_) => {
                last = Some(
                    fencelock_core::BackendError::timeout(
                        crate::error::NAME,
                        "pub/sub connect timed out",
                    )
                    .into(),
                )
            }
        }
    }
    Err(last.unwrap_or_else(|| crate::error::bad_reply("no redis node to subscribe on")))
}

impl Wakeups {
    /// Opens the pub/sub connection and starts its reader; the reader stops
    /// when the returned handle is aborted.
    pub(crate) async fn start(
        clients: NodeClients,
        keys: Keys,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<(Arc<Self>, tokio::task::JoinHandle<()>)> {
        let mut next = 0;
        let (sink, stream) = open(&clients, &mut next, connect_timeout).await?;
        let wakeups = Arc::new(Self {
            hub: WakeHub::new(),
            changes: ChangeHub::new(),
            keys,
            timeout,
            connect_timeout,
            waiters: Mutex::default(),
            listening: tokio::sync::Mutex::new(Listening {
                sink: Some(sink),
                keys: HashSet::new(),
                changes: false,
            }),
        });
        let reader = tokio::spawn(Arc::clone(&wakeups).read(clients, next, stream));
        Ok((wakeups, reader))
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A subscription for `key`, live on the server before this returns, so
    /// a release after the caller's next try cannot be missed.
    pub(crate) async fn subscribe(self: &Arc<Self>, key: &LockKey) -> Result<WakeSubscription> {
        let key = key.as_str().to_owned();
        // The hub entry first: a notice arriving right after SUBSCRIBE
        // returns must find it.
        let hub_sub = self.hub.subscribe(&key);
        *self.waiters().entry(key.clone()).or_default() += 1;
        let waiter = Waiter {
            wakeups: Arc::clone(self),
            key: key.clone(),
        };
        let mut listening = self.listening.lock().await;
        if !listening.keys.contains(&key) {
            let sink = listening.sink.as_mut().ok_or_else(|| {
                fencelock_core::BackendError::message(
                    crate::error::NAME,
                    fencelock_core::ErrorStatus::Transient,
                    "the pub/sub connection is down",
                )
            })?;
            let subscribed =
                tokio::time::timeout(self.timeout, sink.subscribe(self.keys.channel(&key))).await;
            match subscribed {
                Ok(Ok(())) => {
                    listening.keys.insert(key);
                }
                Ok(Err(e)) => return Err(map("SUBSCRIBE", e)),
                Err(_) => {
                    return Err(fencelock_core::BackendError::timeout(
                        crate::error::NAME,
                        "SUBSCRIBE timed out",
                    )
                    .into())
                }
            }
        }
        drop(listening);
        // The waiter is dropped with the stream, i.e. with the subscription.
        Ok(WakeSubscription::from_stream(futures_util::stream::unfold(
            (hub_sub, waiter),
            |(mut sub, waiter)| async move { sub.woken().await.then_some(((), (sub, waiter))) },
        )))
    }

    /// A feed of the store's change notices, subscribed on the server before
    /// this returns.
    pub(crate) async fn changes(&self) -> Result<ChangeFeed> {
        let feed = self.changes.subscribe();
        let mut listening = self.listening.lock().await;
        if !listening.changes {
            let sink = listening.sink.as_mut().ok_or_else(|| {
                fencelock_core::BackendError::message(
                    crate::error::NAME,
                    fencelock_core::ErrorStatus::Transient,
                    "the pub/sub connection is down",
                )
            })?;
            match tokio::time::timeout(self.timeout, sink.subscribe(self.keys.changes())).await {
                Ok(Ok(())) => listening.changes = true,
                Ok(Err(e)) => return Err(map("SUBSCRIBE", e)),
                Err(_) => {
                    return Err(fencelock_core::BackendError::timeout(
                        crate::error::NAME,
                        "SUBSCRIBE timed out",
                    )
                    .into())
                }
            }
        }
        Ok(feed)
    }

    /// Unsubscribes `key` if it has no waiter any more.
    async fn forget(self: Arc<Self>, key: String) {
        let mut listening = self.listening.lock().await;
        if self.waiters().contains_key(&key) || !listening.keys.remove(&key) {
            return;
        }
        if let Some(sink) = listening.sink.as_mut() {
            let channel = self.keys.channel(&key);
            // A failure leaves a subscription that only costs stray notices.
            let _ = tokio::time::timeout(self.timeout, sink.unsubscribe(channel)).await;
        }
    }

    /// Feeds release notices into the hub. While the connection is down
    /// every waiter falls back to backoff (`close_all`); after a reconnect
    /// the keys that still have waiters are subscribed again and all
    /// waiters are woken, because notices may have been missed.
    ///
    /// In a cluster, the node that failed is tried last: the reconnection
    /// starts at the next listed node.
    async fn read(self: Arc<Self>, clients: NodeClients, mut next: usize, first: PubSubStream) {
        let changes = self.keys.changes();
        let mut stream = Some(first);
        let mut delay = Duration::from_millis(50);
        loop {
            if let Some(mut messages) = stream.take() {
                delay = Duration::from_millis(50);
                while let Some(msg) = messages.next().await {
                    if let Ok(key) = std::str::from_utf8(msg.get_payload_bytes()) {
                        if msg.get_channel_name() == changes {
                            self.changes.notify(key);
                        } else {
                            self.hub.notify(key);
                        }
                    }
                }
                tracing::debug!("redis wake-up connection lost; reconnecting");
                *self.listening.lock().await = Listening::default();
                self.hub.close_all();
                next = next.wrapping_add(1);
            }
            // Reconnect attempts are spaced so a dead server is not hammered.
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            match open(&clients, &mut next, self.connect_timeout).await {
                Ok((mut sink, messages)) => {
                    let mut listening = self.listening.lock().await;
                    let waited: Vec<String> = self.waiters().keys().cloned().collect();
                    for key in waited {
                        let channel = self.keys.channel(&key);
                        let subscribed =
                            tokio::time::timeout(self.timeout, sink.subscribe(channel)).await;
                        if matches!(subscribed, Ok(Ok(()))) {
                            listening.keys.insert(key);
                        }
                    }
                    if self.changes.is_followed() {
                        let subscribed =
                            tokio::time::timeout(self.timeout, sink.subscribe(&changes)).await;
                        listening.changes = matches!(subscribed, Ok(Ok(())));
                    }
                    listening.sink = Some(sink);
                    drop(listening);
                    self.hub.notify_all();
                    // Also when the resubscription failed: the follower
                    // then finds changes by listing until it asks again.
                    self.changes.missed();
                    stream = Some(messages);
                }
                Err(e) => tracing::debug!(error = %e, "redis wake-up reconnect failed"),
            }
        }
    }
}

/// One waiter of a key: counted while it lives.
struct Waiter {
    wakeups: Arc<Wakeups>,
    key: String,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = self.wakeups.waiters();
        let Some(n) = waiters.get_mut(&self.key) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        waiters.remove(&self.key);
        drop(waiters);
        // Without a runtime (shutting down) the subscription simply stays
        // until the connection closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(Arc::clone(&self.wakeups).forget(std::mem::take(&mut self.key)));
        }
    }
}
