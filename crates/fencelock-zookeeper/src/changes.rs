//! Changed keys across the store (`Backend::changes`) from one persistent
//! recursive watch of the locks directory, open while some feed is read.
//!
//! A grant creates a lease node under its key's node and a release or
//! force-release deletes one, so the watch names each key whose holder may
//! have changed, whoever changed it. A lease's end is no event (the node
//! stays until the next acquisition clears it) and neither is a renewal
//! (new data): the follower reads the keys whose leases it knows should
//! have ended. Intents name nothing. A fair waiter's queue entry holds the
//! key as soon as the nodes ahead of it are gone (`queue.rs`): the deletion
//! that frees it names the key, and its grant writes nothing. (Versions that
//! wrote the grant marked it with a marker node created and deleted in the
//! same multi op, which still names the key here.)
//!
//! The watch has a session of its own, so that it never shares a path's
//! watch bookkeeping with the waiters' one-shot watches (ZooKeeper before
//! 3.9 keeps one watch mode per path and session). It is added before the
//! first feed is returned, so no change falls between a caller's feed and
//! its listing, and the session is closed once no feed is read. Events
//! that happen while the session reconnects can be lost (the client
//! re-adds the watch, not what it missed), and a session that expired takes
//! its watch with it: either way the feeds are told notices were missed, so
//! that their reader lists the store once.

use std::{sync::Arc, time::Duration};

use fencelock_core::{Backoff, ChangeFeed, Result, WatchedHub};
use zookeeper_client as zk;

use crate::{
    backend::{ZkBackend, GRANTED, NODE, READER},
    conn::{decode, Conn},
    options::ZkBalance,
};

/// How soon the watch follows a `balance=first` connection to its new
/// session.
const MOVES_SEEN_WITHIN: Duration = Duration::from_millis(500);

/// A feed of the store's changes, the watch added on the server before
/// this returns.
pub(crate) async fn feed(backend: &ZkBackend) -> Result<ChangeFeed> {
    backend
        .changes
        .feed(|| async {
            let conn = Conn::open(backend.conn.options.clone()).await?;
            let watched = open(&conn).await?;
            tokio::spawn(run(Arc::clone(&backend.changes), conn, watched));
            Ok(())
        })
        .await
}

/// The watch, and the session it was added on.
type Watched = (zk::PersistentWatcher, zk::SessionId);

async fn open(conn: &Conn) -> Result<Watched> {
    let client = conn.client().await?;
    let watcher = conn
        .call(
            "watching the locks",
            client.watch(&conn.locks_dir(), zk::AddWatchMode::PersistentRecursive),
        )
        .await?;
    Ok((watcher, client.session_id()))
}

/// Feeds the hub from the watch until no feed is read; the session ends
/// with this task.
async fn run(changes: Arc<WatchedHub>, conn: Conn, watched: Watched) {
    let dir = format!("{}/", conn.locks_dir());
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let (mut watcher, mut session) = watched;
    let mut disconnected = false;
    loop {
        if conn.session_id() != session {
            // With `balance=first` the connection moved to a new session
            // (`conn.rs`): the watch follows it, the old one goes with its
            // watcher.
            let Some(again) = reopen(&conn, &changes, &mut backoff).await else {
                return;
            };
            (watcher, session) = again;
            disconnected = false;
            changes.hub().missed();
        }
        let event = tokio::select! {
            event = watcher.changed() => event,
            // A quiet store: whether anyone still reads is checked now and
            // then, not only when a change arrives.
            () = tokio::time::sleep(conn.options.timeout) => {
                if changes.unfollowed().await {
                    return;
                }
                continue;
            }
            // A move is seen as soon as the steward makes it (above): a
            // lost server's session names nothing more.
            () = tokio::time::sleep(MOVES_SEEN_WITHIN), if conn.options.balance == ZkBalance::First => {
                continue;
            }
        };
        match event.event_type {
            zk::EventType::NodeCreated | zk::EventType::NodeDeleted => {
                if let Some(key) = changed(&dir, &event.path) {
                    changes.hub().notify(&key);
                }
                if !changes.hub().is_followed() && changes.unfollowed().await {
                    return;
                }
            }
            zk::EventType::Session if event.session_state.is_terminated() => {
                // The watcher must not be read again: a new session (the
                // connection opens one) and a new watch.
                tracing::debug!(state = ?event.session_state, "ZooKeeper change watch ended; adding it again");
                let Some(again) = reopen(&conn, &changes, &mut backoff).await else {
                    return;
                };
                (watcher, session) = again;
                disconnected = false;
                changes.hub().missed();
            }
            zk::EventType::Session => match event.session_state {
                zk::SessionState::Disconnected => disconnected = true,
                _ if disconnected => {
                    // The session is back, but not always its persistent
                    // watch: zookeeper-client 0.11 re-sends only one-shot
                    // watches when it reconnects (tests/it/changes.rs shows a
                    // restarted server naming nothing after). So the watch
                    // is added again; on the server a second add of the
                    // same watch is the same watch. The old watcher is
                    // dropped only once the new one exists, so that its
                    // removal, seeing another watcher of the path, leaves
                    // the server's watch alone.
                    let Some(again) = reopen(&conn, &changes, &mut backoff).await else {
                        return;
                    };
                    (watcher, session) = again;
                    disconnected = false;
                    changes.hub().missed();
                }
                _ => {}
            },
            _ => {}
        }
    }
}

/// Adds the watch again, retrying with `backoff` until it is added; `None`
/// once no feed is read any more.
async fn reopen(conn: &Conn, changes: &WatchedHub, backoff: &mut Backoff) -> Option<Watched> {
    loop {
        if changes.unfollowed().await {
            return None;
        }
        match open(conn).await {
            Ok(again) => {
                backoff.reset();
                return Some(again);
            }
            Err(e) => {
                tracing::debug!(error = %e, "ZooKeeper change watch: adding it failed");
                tokio::time::sleep(backoff.next_retry()).await;
            }
        }
    }
}

/// The key whose holder a node event at `path` may have changed: a lease
/// node's, directly under a key's node in `dir`.
fn changed(dir: &str, path: &str) -> Option<String> {
    let (key, node) = path.strip_prefix(dir)?.split_once('/')?;
    (node.starts_with(NODE) || node.starts_with(READER) || node.starts_with(GRANTED))
        .then(|| decode(key))
        .flatten()
}
