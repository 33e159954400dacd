//! Release wake-ups: one NOTIFY channel per lock key, listened to only while
//! this backend has a waiter for that key.
//!
//! With one channel for every key, each release's notice reached every
//! listening process, waiter or not, and woke its listener task for
//! nothing. A release now notifies the channel of its key (see
//! [`channel`]), and the listener connection LISTENs to a key's channel
//! only while a subscription for the key lives, so a notice nobody waits
//! for is dropped by the server. The connection opens with the first
//! waiter; a one-shot process that never waits uses one connection.
//!
//! The same connection carries the store's change notices
//! (`Backend::changes`): every grant and release also notifies one channel
//! for the whole table ([`changes_channel`]), listened to while a lock
//! service follows its event stream. While that is followed, a lost
//! connection is re-opened by the listener itself (no waiter may come to
//! ask for it), and the feed is told it missed notices.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use fencelock_core::{Backoff, ChangeFeed, ChangeHub, LockKey, WakeHub, WakeSubscription};
use md5::{Digest, Md5};
use sqlx::{postgres::PgListener, PgPool};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::Instant,
};

/// What every wake-up channel's name starts with.
const CHANNEL_PREFIX: &str = "fencelock_wake_";

/// The SQL expression of the channel of the key in column `key` of table
/// `locks`: the same name as [`channel`] computes, so a statement that
/// deletes rows it did not know the keys of can notify each.
pub(crate) fn channel_sql(locks: &str) -> String {
    format!("'{CHANNEL_PREFIX}' || md5('{locks}:' || key)")
}

/// The NOTIFY channel of every grant and release in table `locks`: a
/// fixed prefix and the hex MD5 of the table name, 50 bytes.
pub(crate) fn changes_channel(locks: &str) -> String {
    let digest = Md5::new().chain_update(locks.as_bytes()).finalize();
    let mut name = String::from("fencelock_changes_");
    for byte in digest {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// The NOTIFY channel of `key` in table `locks`: a fixed prefix and the
/// hex MD5 of the table and the key, 47 bytes, within PostgreSQL's 63-byte
/// identifiers whatever the key. The table name is `[a-z0-9_]`, so the
/// first `:` separates it from the key. Two keys whose hashes collide share
/// a channel, which costs a spurious wake-up and nothing else (the hub
/// matches the notice's payload, the key itself).
pub(crate) fn channel(locks: &str, key: &str) -> String {
    let digest = Md5::new()
        .chain_update(locks.as_bytes())
        .chain_update(b":")
        .chain_update(key.as_bytes())
        .finalize();
    let mut name = String::with_capacity(CHANNEL_PREFIX.len() + 32);
    name.push_str(CHANNEL_PREFIX);
    for byte in digest {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

enum Command {
    /// LISTEN to the channel (connecting first if needed), then answer
    /// whether it is listened to.
    Listen(String, oneshot::Sender<bool>),
    /// UNLISTEN the channel unless it has waiters again.
    Unlisten(String),
}

/// What the subscriptions and the listener task share.
struct Shared {
    hub: WakeHub,
    changes: ChangeHub,
    /// [`changes_channel`] of the table.
    changes_channel: String,
    locks: String,
    /// Live subscriptions per channel.
    waiters: Mutex<HashMap<String, usize>>,
    commands: mpsc::UnboundedSender<Command>,
    /// Notices received, for the test that only waited-for keys arrive.
    #[cfg(test)]
    notices: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn waiters(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The listener of one backend; its task stops when this is dropped.
pub(crate) struct Listener {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    /// How long a subscription waits for its LISTEN (and the connection).
    timeout: Duration,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Starts the listener task; it connects with the first subscription,
    /// each attempt bounded by `timeout`.
    pub(crate) fn spawn(pool: PgPool, locks: String, timeout: Duration) -> Self {
        let (commands, received) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            hub: WakeHub::new(),
            changes: ChangeHub::new(),
            changes_channel: changes_channel(&locks),
            locks,
            waiters: Mutex::default(),
            commands,
            #[cfg(test)]
            notices: std::sync::atomic::AtomicU64::new(0),
        });
        let task = tokio::spawn(run(pool, Arc::clone(&shared), received, timeout));
        Self {
            shared,
            task,
            timeout,
        }
    }

    /// A subscription for `key`, listened to on the server before this
    /// returns (so a release after the caller's next try is not missed), or
    /// `None` when the listener cannot listen now: the waiter then backs
    /// off with jitter.
    pub(crate) async fn subscribe(&self, key: &LockKey) -> Option<WakeSubscription> {
        // The hub entry first: a notice arriving right after LISTEN must
        // find it.
        let subscription = self.shared.hub.subscribe(key.as_str());
        let channel = channel(&self.shared.locks, key.as_str());
        *self.shared.waiters().entry(channel.clone()).or_default() += 1;
        let waiter = Waiter {
            shared: Arc::clone(&self.shared),
            channel: channel.clone(),
        };
        let (ack, acked) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Listen(channel, ack))
            .ok()?;
        match tokio::time::timeout(self.timeout, acked).await {
            Ok(Ok(true)) => {}
            _ => return None,
        }
        // The waiter lives as long as the subscription's stream.
        Some(WakeSubscription::from_stream(futures_util::stream::unfold(
            (subscription, waiter),
            |(mut sub, waiter)| async move { sub.woken().await.then_some(((), (sub, waiter))) },
        )))
    }

    /// A feed of the table's change notices, listened to on the server
    /// before this returns; `None` when the listener cannot listen now.
    pub(crate) async fn changes(&self) -> Option<ChangeFeed> {
        let feed = self.shared.changes.subscribe();
        let (ack, acked) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Listen(self.shared.changes_channel.clone(), ack))
            .ok()?;
        match tokio::time::timeout(self.timeout, acked).await {
            Ok(Ok(true)) => Some(feed),
            _ => None,
        }
    }

    #[cfg(test)]
    pub(crate) fn notices(&self) -> u64 {
        self.shared
            .notices
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One subscription of a channel: counted while it lives.
struct Waiter {
    shared: Arc<Shared>,
    channel: String,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = self.shared.waiters();
        let Some(n) = waiters.get_mut(&self.channel) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            waiters.remove(&self.channel);
            drop(waiters);
            // The task re-reads the count, so a new waiter that arrived
            // meanwhile keeps the channel. Without the task (backend gone)
            // there is nothing to unlisten.
            let _ = self
                .shared
                .commands
                .send(Command::Unlisten(std::mem::take(&mut self.channel)));
        }
    }
}

/// The listener connection and the channels it listens to.
struct Connection {
    listener: PgListener,
    channels: HashSet<String>,
}

/// Serves the commands in order, one at a time, so that LISTEN and UNLISTEN
/// reach the server in an order that leaves every channel with a waiter
/// listened to, and feeds notices into the hub meanwhile.
async fn run(
    pool: PgPool,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    timeout: Duration,
) {
    let mut conn: Option<Connection> = None;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    // After a failed connect, subscriptions are refused at once until this
    // instant rather than each waiting for a dead server.
    let mut retry_at: Option<Instant> = None;
    loop {
        let command = match conn.as_mut() {
            Some(c) => tokio::select! {
                command = commands.recv() => command,
                notice = c.listener.try_recv() => {
                    match notice {
                        Ok(Some(notice)) => {
                            if notice.channel() == shared.changes_channel {
                                shared.changes.notify(notice.payload());
                                continue;
                            }
                            #[cfg(test)]
                            shared.notices.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            shared.hub.notify(notice.payload());
                        }
                        _ => {
                            tracing::debug!("wake-up listener lost its connection");
                            conn = None;
                            // Waiters fall back to backoff and subscribe
                            // again, which reconnects.
                            shared.hub.close_all();
                            shared.changes.missed();
                        }
                    }
                    continue;
                }
            },
            // A followed change feed has nobody to ask for a reconnection:
            // the task retries on its own, spaced by the backoff.
            None if shared.changes.is_followed() => {
                let pause = retry_at.map_or(Duration::ZERO, |at| {
                    at.saturating_duration_since(Instant::now())
                });
                tokio::select! {
                    command = commands.recv() => command,
                    () = tokio::time::sleep(pause) => {
                        match connect(&pool, &shared, timeout).await {
                            Ok(c) => {
                                backoff.reset();
                                retry_at = None;
                                conn = Some(c);
                                shared.changes.missed();
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "change listener cannot connect");
                                retry_at = Some(Instant::now() + backoff.next_pause());
                            }
                        }
                        continue;
                    }
                }
            }
            None => commands.recv().await,
        };
        let Some(command) = command else { return };
        match command {
            Command::Unlisten(channel) => {
                if shared.waiters().contains_key(&channel) {
                    continue;
                }
                let Some(c) = conn.as_mut() else { continue };
                if c.channels.remove(&channel) {
                    let done =
                        fencelock_sql_common::bounded(timeout, c.listener.unlisten(&channel));
                    if done.await.is_err() {
                        conn = None;
                        shared.hub.close_all();
                    }
                }
            }
            Command::Listen(channel, ack) => {
                if conn.is_none() {
                    if retry_at.is_some_and(|at| Instant::now() < at) {
                        let _ = ack.send(false);
                        continue;
                    }
                    match connect(&pool, &shared, timeout).await {
                        Ok(c) => {
                            backoff.reset();
                            retry_at = None;
                            // No wake-up is owed for the time without a
                            // connection: losing it ended every subscription
                            // (close_all), and a subscription is handed out
                            // only once its channel is listened to.
                            conn = Some(c);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "wake-up listener cannot connect");
                            retry_at = Some(Instant::now() + backoff.next_pause());
                            let _ = ack.send(false);
                            continue;
                        }
                    }
                }
                let Some(c) = conn.as_mut() else { continue };
                if !c.channels.contains(&channel) {
                    let done = fencelock_sql_common::bounded(timeout, c.listener.listen(&channel));
                    if done.await.is_err() {
                        conn = None;
                        shared.hub.close_all();
                        let _ = ack.send(false);
                        continue;
                    }
                    c.channels.insert(channel);
                }
                let _ = ack.send(true);
            }
        }
    }
}

/// Connects and listens to the channel of every key that has waiters.
async fn connect(
    pool: &PgPool,
    shared: &Shared,
    timeout: Duration,
) -> Result<Connection, sqlx::Error> {
    fencelock_sql_common::bounded(timeout, async {
        let mut listener = PgListener::connect_with(pool).await?;
        // A lost connection is reported to the task (which wakes every
        // waiter, as notices may have been missed) instead of being
        // replaced behind its back.
        listener.eager_reconnect(false);
        let mut waited: Vec<String> = shared.waiters().keys().cloned().collect();
        if shared.changes.is_followed() {
            waited.push(shared.changes_channel.clone());
        }
        let mut channels = HashSet::new();
        for channel in waited {
            listener.listen(&channel).await?;
            channels.insert(channel);
        }
        Ok(Connection { listener, channels })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_short_identifiers_per_table_and_key() {
        let long = "k".repeat(255);
        let name = channel("fencelock_locks", &long);
        assert_eq!(name.len(), CHANNEL_PREFIX.len() + 32);
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        assert_ne!(name, channel("other_locks", &long));
        assert_ne!(name, channel("fencelock_locks", "k"));
        // md5("fencelock_locks:k"), as PostgreSQL's md5() computes it.
        assert_eq!(
            channel("fencelock_locks", "k"),
            format!("{CHANNEL_PREFIX}{}", "27965d0fa9f66bd901189d1ee152566b")
        );
    }
}
