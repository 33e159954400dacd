//! Changed keys across a whole store: what the lock service's event stream
//! follows instead of listing the backend over and over
//! (`docs/http.md#events`).
//!
//! A backend that is told of every acquisition and release, whoever makes
//! it (PostgreSQL NOTIFY, Redis pub/sub, an etcd or ZooKeeper watch), feeds
//! each key into a
//! [`ChangeHub`]; a follower reads a [`ChangeFeed`] and looks at those keys
//! only. A notice names a key, not what happened to it: the follower reads
//! the key's holder itself, so a notice that arrives late or twice costs a
//! read and nothing else. Expiries and renewals are not announced: the
//! follower knows when each lease it saw should end.

use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use tokio::sync::mpsc;

/// Notices a feed buffers before it reports [`Change::Missed`] instead.
const FEED_BUFFER: usize = 8192;

/// One item of a [`ChangeFeed`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// The holder of this key may have changed (acquired, released,
    /// force-released).
    Key(String),
    /// Notices may have been lost (the notification connection dropped, or
    /// the reader fell behind): every key may have changed.
    Missed,
}

/// Keys whose holder may have changed, from [`crate::Backend::changes`].
///
/// It ends (`None`) when the backend stops feeding it; the follower then
/// has to find changes another way.
pub struct ChangeFeed {
    rx: mpsc::Receiver<Change>,
    overflowed: Arc<AtomicBool>,
}

impl ChangeFeed {
    /// The next notice; `None` once the backend stopped feeding this feed.
    pub async fn next(&mut self) -> Option<Change> {
        // Checked before each read: a full buffer means notices were dropped
        // after the buffered ones, so the loss is reported before them.
        if self.overflowed.swap(false, Ordering::AcqRel) {
            return Some(Change::Missed);
        }
        self.rx.recv().await
    }

    /// The next notice if one is waiting, without waiting.
    pub fn try_next(&mut self) -> Option<Change> {
        if self.overflowed.swap(false, Ordering::AcqRel) {
            return Some(Change::Missed);
        }
        self.rx.try_recv().ok()
    }
}

impl fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeFeed").finish_non_exhaustive()
    }
}

struct Follower {
    tx: mpsc::Sender<Change>,
    overflowed: Arc<AtomicBool>,
}

/// Fans a backend's change notices out to its [`ChangeFeed`]s. Never
/// blocks the backend's notification reader (which also serves wake-ups):
/// a feed that is full is told it missed notices instead.
#[derive(Clone, Default)]
pub struct ChangeHub {
    followers: Arc<Mutex<Vec<Follower>>>,
}

impl ChangeHub {
    /// A hub without feeds.
    pub fn new() -> Self {
        Self::default()
    }

    fn followers(&self) -> std::sync::MutexGuard<'_, Vec<Follower>> {
        self.followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A new feed, which sees the notices from now on.
    pub fn subscribe(&self) -> ChangeFeed {
        let (tx, rx) = mpsc::channel(FEED_BUFFER);
        let overflowed = Arc::new(AtomicBool::new(false));
        self.followers().push(Follower {
            tx,
            overflowed: Arc::clone(&overflowed),
        });
        ChangeFeed { rx, overflowed }
    }

    /// Whether any feed is still read (a backend may skip listening then).
    pub fn is_followed(&self) -> bool {
        let mut followers = self.followers();
        followers.retain(|f| !f.tx.is_closed());
        !followers.is_empty()
    }

    fn send(&self, change: &Change) {
        self.followers()
            .retain(|f| match f.tx.try_send(change.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    f.overflowed.store(true, Ordering::Release);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// The holder of `key` may have changed.
    pub fn notify(&self, key: &str) {
        self.send(&Change::Key(key.to_owned()));
    }

    /// Notices may have been lost, e.g. the notification connection was
    /// down for a while.
    pub fn missed(&self) {
        self.send(&Change::Missed);
    }
}

impl fmt::Debug for ChangeHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeHub")
            .field("feeds", &self.followers().len())
            .finish()
    }
}

/// A [`ChangeHub`] fed by one watch of the backend's own (an etcd watch, a
/// ZooKeeper persistent watch) that runs only while some feed is read.
///
/// The first feed starts the watch and the watch's task stops itself once
/// no feed is read, both under one lock: there is never more than one
/// watch, and a feed subscribed while the task stops starts another.
#[derive(Debug, Default)]
pub struct WatchedHub {
    hub: ChangeHub,
    /// Whether the watch's task runs.
    watching: tokio::sync::Mutex<bool>,
}

impl WatchedHub {
    /// A hub whose watch does not run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the watch's task sends its notices.
    pub fn hub(&self) -> &ChangeHub {
        &self.hub
    }

    /// A new feed. When no watch runs, `start` opens one (on the server
    /// before it returns, so that no change falls between the caller's feed
    /// and its listing) and spawns the task that reads it.
    pub async fn feed<F, Fut>(&self, start: F) -> crate::Result<ChangeFeed>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = crate::Result<()>>,
    {
        let feed = self.hub.subscribe();
        let mut watching = self.watching.lock().await;
        if !*watching {
            start().await?;
            *watching = true;
        }
        Ok(feed)
    }

    /// For the watch's task: whether it should end because no feed is
    /// read. If so it is marked stopped, and the next feed starts a watch.
    pub async fn unfollowed(&self) -> bool {
        let mut watching = self.watching.lock().await;
        if self.hub.is_followed() {
            return false;
        }
        *watching = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_feed_reports_the_loss_first() {
        let hub = ChangeHub::new();
        let mut feed = hub.subscribe();
        for i in 0..=FEED_BUFFER {
            hub.notify(&i.to_string());
        }
        assert_eq!(feed.next().await, Some(Change::Missed));
        assert_eq!(feed.next().await, Some(Change::Key("0".to_owned())));
    }

    #[tokio::test]
    async fn a_dropped_feed_is_no_longer_followed() {
        let hub = ChangeHub::new();
        let feed = hub.subscribe();
        assert!(hub.is_followed());
        drop(feed);
        hub.notify("a");
        assert!(!hub.is_followed());
    }
}
