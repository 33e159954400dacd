//! Changed keys across the store (`Backend::changes`) from one etcd watch
//! of the lock keys' prefix, `P/locks/`, open while some feed is read.
//!
//! Every grant creates its key and every release, force-release or expiry
//! deletes it (etcd deletes an ended lease's keys itself), so the watch
//! names each key whose holder may have changed, whoever changed it,
//! expiries included. A PUT of a key that already existed (new data, a
//! grant moved to another lease) changes no holder, and waiting writers'
//! intents and queue entries are no leases: neither is a notice.
//!
//! One watch serves every feed of a backend and its clones. It is opened
//! before the first feed is returned, so no change falls between a caller's
//! feed and its listing, and closed once no feed is read. When it breaks
//! (etcd restarted, the member went away, the watch was cancelled) it is
//! opened again and the feeds are told notices were missed, so that their
//! reader lists the store once.

use std::{sync::Arc, time::Duration};

use etcd_client::{Event, EventType, WatchOptions, WatchStream};
use fencelock_core::{Backoff, ChangeFeed, Result};

use crate::{
    backend::{EtcdBackend, INTENT},
    queue::QUEUE,
};

/// A feed of the store's changes, the watch open on etcd before this
/// returns.
pub(crate) async fn feed(backend: &EtcdBackend) -> Result<ChangeFeed> {
    backend
        .changes
        .feed(|| async {
            let stream = open(backend).await?;
            tokio::spawn(run(backend.clone(), stream));
            Ok(())
        })
        .await
}

async fn open(backend: &EtcdBackend) -> Result<WatchStream> {
    backend
        .open_watch_at(backend.locks_prefix(), WatchOptions::new().with_prefix())
        .await
}

/// Feeds the hub from `stream`, opening the watch again when it breaks,
/// until no feed is read.
async fn run(backend: EtcdBackend, mut stream: WatchStream) {
    let changes = Arc::clone(&backend.changes);
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                // A quiet store: whether anyone still reads is checked now
                // and then, not only when a change arrives.
                () = tokio::time::sleep(backend.options.timeout) => {
                    if changes.unfollowed().await {
                        return;
                    }
                    continue;
                }
            };
            match message {
                Ok(Some(resp)) if !resp.canceled() => {
                    for key in resp.events().iter().filter_map(|e| changed(&backend, e)) {
                        changes.hub().notify(key);
                    }
                    if !changes.hub().is_followed() && changes.unfollowed().await {
                        return;
                    }
                }
                Ok(Some(resp)) => {
                    tracing::debug!(
                        reason = resp.cancel_reason(),
                        "etcd change watch cancelled; opening it again"
                    );
                    break;
                }
                Ok(None) => {
                    tracing::debug!("etcd change watch ended; opening it again");
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "etcd change watch broke; opening it again");
                    break;
                }
            }
        }
        loop {
            if changes.unfollowed().await {
                return;
            }
            tokio::time::sleep(backoff.next_retry()).await;
            match open(&backend).await {
                Ok(again) => {
                    stream = again;
                    backoff.reset();
                    // Whatever changed while the watch was down was not seen.
                    changes.hub().missed();
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "etcd change watch: opening failed"),
            }
        }
    }
}

/// The user key whose holder `event` may have changed, if any.
fn changed<'a>(backend: &EtcdBackend, event: &'a Event) -> Option<&'a str> {
    let kv = event.kv()?;
    if event.event_type() == EventType::Put && kv.create_revision() != kv.mod_revision() {
        return None;
    }
    let raw = std::str::from_utf8(kv.key()).ok()?;
    let rest = raw.strip_prefix(backend.locks_prefix().as_str())?;
    match rest.find('\0') {
        None => Some(rest),
        Some(at) => {
            let (key, suffix) = rest.split_at(at);
            (!suffix.starts_with(INTENT) && !suffix.starts_with(QUEUE)).then_some(key)
        }
    }
}
