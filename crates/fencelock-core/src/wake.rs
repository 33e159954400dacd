//! Release wake-ups: how a waiter learns that a key may have become free
//! without polling.

use std::{
    collections::HashMap,
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
};

use futures_util::{Stream, StreamExt};
use tokio::sync::watch;

/// A stream of "the key may be free now" signals for one key.
///
/// A wake-up is only a hint: the waiter always tries again and may lose to
/// another waiter. When the source ends (connection to the backend lost),
/// [`WakeSubscription::woken`] returns `false` and the waiter falls back to
/// jittered backoff.
pub struct WakeSubscription {
    source: Source,
    complete: bool,
}

enum Source {
    Hub {
        rx: watch::Receiver<u64>,
        hub: WakeHub,
        key: String,
    },
    Stream(Pin<Box<dyn Stream<Item = ()> + Send>>),
}

impl Drop for WakeSubscription {
    /// The last subscription of a key removes the key's entry, so waiting on
    /// many keys that are never released (only expire) does not grow the hub.
    fn drop(&mut self) {
        if let Source::Hub { hub, key, .. } = &self.source {
            let mut senders = hub.senders.lock().unwrap_or_else(PoisonError::into_inner);
            // This subscription's receiver is still alive here.
            if senders.get(key).is_some_and(|s| s.receiver_count() <= 1) {
                senders.remove(key);
            }
        }
    }
}

impl WakeSubscription {
    /// Wraps a backend's own stream of wake-ups (e.g. an etcd watch).
    pub fn from_stream(stream: impl Stream<Item = ()> + Send + 'static) -> Self {
        Self {
            source: Source::Stream(Box::pin(stream)),
            complete: false,
        }
    }

    /// Marks the source as complete: while it lives, every change that may
    /// free the key is signalled (an ordered watch of the key's store, such
    /// as etcd's, not a best-effort channel such as pub/sub). A waiter then
    /// tries again when woken and otherwise once a second, not on a backoff
    /// from a millisecond, so that a try of its own seldom stands between a
    /// release and the waiter's answer to it; after a failed try, or once
    /// the source ends, it backs off as usual.
    #[must_use]
    pub fn complete(mut self) -> Self {
        self.complete = true;
        self
    }

    /// Whether the source signals every change ([`WakeSubscription::complete`]).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Waits for the next wake-up. Returns `false`, at once and forever after,
    /// when the source has ended.
    pub async fn woken(&mut self) -> bool {
        match &mut self.source {
            Source::Hub { rx, .. } => rx.changed().await.is_ok(),
            Source::Stream(s) => s.next().await.is_some(),
        }
    }
}

impl fmt::Debug for WakeSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WakeSubscription")
    }
}

/// Fans release notices for many keys out to the waiters of each key.
///
/// A backend with one notification channel (PostgreSQL LISTEN, Redis pub/sub,
/// or the process itself for in-process backends) feeds every notice into
/// [`WakeHub::notify`]; waiters get a [`WakeSubscription`] per key. Entries
/// with no subscribers left are dropped on the next notice for their key.
#[derive(Clone, Default)]
pub struct WakeHub {
    senders: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

impl WakeHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// A subscription to wake-ups for `key`.
    pub fn subscribe(&self, key: &str) -> WakeSubscription {
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = senders
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        WakeSubscription {
            source: Source::Hub {
                rx: sender.subscribe(),
                hub: self.clone(),
                key: key.to_owned(),
            },
            complete: false,
        }
    }

    /// Wakes every waiter of `key`.
    pub fn notify(&self, key: &str) {
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = senders.get(key) {
            if sender.receiver_count() == 0 {
                senders.remove(key);
            } else {
                sender.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Wakes every waiter of every key, e.g. after the notification channel
    /// reconnected and notices may have been missed.
    pub fn notify_all(&self) {
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        senders.retain(|_, s| s.receiver_count() > 0);
        for sender in senders.values() {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Ends every subscription (their `woken` returns `false`), so waiters fall
    /// back to backoff, e.g. while the notification channel is down.
    pub fn close_all(&self) {
        self.senders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl fmt::Debug for WakeHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self
            .senders
            .lock()
            .map(|s| s.len())
            .unwrap_or_else(|e| e.into_inner().len());
        f.debug_struct("WakeHub").field("keys", &n).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn notify_wakes_only_that_key() {
        let hub = WakeHub::new();
        let mut a = hub.subscribe("a");
        let mut b = hub.subscribe("b");
        hub.notify("a");
        assert!(a.woken().await);
        let pending = tokio::time::timeout(std::time::Duration::from_millis(20), b.woken()).await;
        assert!(pending.is_err(), "b must not be woken by a's release");
    }

    #[tokio::test]
    async fn a_notice_before_waiting_is_not_lost() {
        let hub = WakeHub::new();
        let mut a = hub.subscribe("a");
        hub.notify("a"); // released between the try and the wait
        assert!(a.woken().await);
    }

    #[test]
    fn the_last_subscription_removes_its_key() {
        let hub = WakeHub::new();
        let a1 = hub.subscribe("a");
        let a2 = hub.subscribe("a");
        drop(a1);
        assert_eq!(hub.senders.lock().unwrap().len(), 1);
        drop(a2);
        assert!(hub.senders.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn closing_ends_subscriptions() {
        let hub = WakeHub::new();
        let mut a = hub.subscribe("a");
        hub.close_all();
        assert!(!a.woken().await);
    }
}
