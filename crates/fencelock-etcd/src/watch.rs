//! Holder changes of one key (`Backend::watch`) from an etcd watch.
//!
//! A PUT that creates the key is an acquisition. A DELETE is a release or an
//! expiry, and etcd does not say which: the deleted key's lease tells. A
//! release deletes only the key, so its lease lives on (shared with other
//! grants, or left to expire later); an expiry deletes the key *because* the
//! lease ended, so the lease is gone. A key force-released with a lease
//! that happened to end just after is reported as expired, which is what
//! its holder would have seen a moment later anyway.

use std::time::Duration;

use etcd_client::{Event, EventType, WatchOptions, WatchResponse, WatchStream};
use fencelock_core::{HolderChange, LeaseId, LockKey, Result, Watch, WatchFeeder};

use crate::{
    backend::{decode, token_of, EtcdBackend},
    error::map,
};

/// A watch of `key` from now on, fed by a task that ends when the watch is
/// dropped or the etcd watch ends.
pub(crate) async fn watch(backend: &EtcdBackend, key: &LockKey) -> Result<Watch> {
    let stream = backend
        .open_watch(key, WatchOptions::new().with_prev_key())
        .await?;
    let (feeder, watch) = Watch::channel();
    tokio::spawn(feed(backend.clone(), key.clone(), stream, feeder));
    Ok(watch)
}

async fn feed(backend: EtcdBackend, key: LockKey, mut stream: WatchStream, feeder: WatchFeeder) {
    loop {
        let message = tokio::select! {
            biased;
            _ = feeder.closed() => return,
            message = stream.message() => message,
        };
        let resp: WatchResponse = match message {
            Ok(Some(resp)) if !resp.canceled() => resp,
            Ok(_) => return,
            Err(e) => {
                let _ = feeder.send(Err(map("watch", e))).await;
                return;
            }
        };
        for event in resp.events() {
            let change = match change(&backend, &key, event).await {
                Ok(Some(change)) => Ok(change),
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            if !feeder.send(change).await {
                return;
            }
        }
    }
}

/// The holder change `event` stands for, if any (a PUT that moves a grant
/// to another lease changes nothing).
async fn change(
    backend: &EtcdBackend,
    key: &LockKey,
    event: &Event,
) -> Result<Option<HolderChange>> {
    match event.event_type() {
        EventType::Put => {
            let Some(kv) = event
                .kv()
                .filter(|kv| kv.create_revision() == kv.mod_revision())
            else {
                return Ok(None);
            };
            // Gone already (its lease ended since): the DELETE follows; the
            // acquisition is reported all the same, as having no time left.
            let left = backend
                .remaining(kv.lease())
                .await?
                .unwrap_or(Duration::ZERO);
            Ok(Some(HolderChange::Acquired(
                backend.describe(key.clone(), kv, left)?.0,
            )))
        }
        EventType::Delete => {
            let Some(prev) = event.prev_kv() else {
                return Ok(None);
            };
            let lease = LeaseId::new(key.clone(), decode(prev)?.owner, token_of(prev));
            Ok(Some(match backend.remaining(prev.lease()).await? {
                Some(_) => HolderChange::Released(lease),
                None => HolderChange::Expired(lease),
            }))
        }
    }
}
