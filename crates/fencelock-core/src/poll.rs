//! Holder changes on backends without a native stream: a [`Watch`] fed by
//! inspecting the key every interval and reporting the difference.
//!
//! A watch is an observer, not a held item, so each one has its own small
//! task (the renewer schedules held leases only); the task ends when the
//! [`Watch`] is dropped. Latency is one interval plus one `inspect` round
//! trip; a lease granted and ended between two polls is not seen at all
//! (see `docs/election.md`).

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use crate::{
    backend::Backend,
    deadline::bounded,
    error::Result,
    types::{LeaseId, LockInfo, LockKey},
    watch::{HolderChange, Watch, WatchFeeder},
};

/// Default time between two polls of a polled watch.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The lease last seen and the earliest local instant at which it can have
/// ended: the instant its inspection was *sent* plus the remaining time the
/// backend reported, less the clock drift allowed by the default
/// [`crate::ClockPolicy`] (1 %).
struct Seen {
    lease: LeaseId,
    ends_no_earlier: Instant,
}

impl Seen {
    fn new(info: &LockInfo, sent: Instant) -> Self {
        Self {
            lease: LeaseId::new(info.key.clone(), info.owner.clone(), info.token),
            ends_no_earlier: sent + info.expires_in.mul_f64(0.99),
        }
    }

    /// How the lease ended, judged when an inspection that no longer found
    /// it answered at `answered`: if its end could already have come, it
    /// expired (a release just before the end is reported as an expiry, an
    /// expiry is never reported as a release).
    fn ended(self, answered: Instant) -> HolderChange {
        if answered >= self.ends_no_earlier {
            HolderChange::Expired(self.lease)
        } else {
            HolderChange::Released(self.lease)
        }
    }
}

/// A watch of `key` that polls `backend` every `interval`, each inspection
/// bounded by `op_timeout`. The current holder is read before this returns
/// (and not reported): changes from now on are.
pub(crate) async fn poll_watch(
    backend: Arc<dyn Backend>,
    key: LockKey,
    interval: Duration,
    op_timeout: Duration,
) -> Result<Watch> {
    Ok(read_and_poll(backend, key, interval, op_timeout).await?.1)
}

/// The holder of `key` as read now, and a polled watch whose baseline is
/// that very read: every change after it is reported, none before it. An
/// observer that reports the read itself first needs this; a read of its
/// own beside [`poll_watch`]'s would leave a gap, since a lease granted
/// after the watch's read and ended before the next poll is reported by
/// neither (the observer would show a holder and never its end).
pub(crate) async fn read_and_poll(
    backend: Arc<dyn Backend>,
    key: LockKey,
    interval: Duration,
    op_timeout: Duration,
) -> Result<(Option<LockInfo>, Watch)> {
    let sent = Instant::now();
    let current = bounded(op_timeout, "inspect", backend.inspect(&key)).await?;
    let seen = current.as_ref().map(|info| Seen::new(info, sent));
    let (feeder, watch) = Watch::channel();
    tokio::spawn(feed(backend, key, interval, op_timeout, seen, feeder));
    Ok((current, watch))
}

async fn feed(
    backend: Arc<dyn Backend>,
    key: LockKey,
    interval: Duration,
    op_timeout: Duration,
    mut seen: Option<Seen>,
    feeder: WatchFeeder,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once; the holder was just read.
    ticks.tick().await;
    loop {
        tokio::select! {
            biased;
            _ = feeder.closed() => return,
            _ = ticks.tick() => {}
        }
        let sent = Instant::now();
        let current = match bounded(op_timeout, "inspect", backend.inspect(&key)).await {
            Ok(current) => current,
            Err(e) if e.is_transient() => {
                // The next poll tries again; an observer cares about changes,
                // not about one unanswered read.
                tracing::debug!(key = %key, error = %e, "watch poll failed; retrying");
                continue;
            }
            Err(e) => {
                let _ = feeder.send(Err(e)).await;
                return;
            }
        };
        let answered = Instant::now();
        let mut changes = Vec::new();
        match (seen.take(), current) {
            (Some(old), Some(info)) if old.lease.token == info.token => {
                // Same lease, perhaps renewed: only its end moves.
                seen = Some(Seen::new(&info, sent));
            }
            (old, Some(info)) => {
                if let Some(old) = old {
                    changes.push(old.ended(answered));
                }
                seen = Some(Seen::new(&info, sent));
                changes.push(HolderChange::Acquired(info));
            }
            (Some(old), None) => changes.push(old.ended(answered)),
            (None, None) => {}
        }
        for change in changes {
            if !feeder.send(Ok(change)).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use super::*;
    use crate::{AcquireRequest, MemoryBackend, Owner};

    fn lease_of(key: &LockKey, owner: &Owner, info: &crate::Grant) -> LeaseId {
        LeaseId::new(key.clone(), owner.clone(), info.token)
    }

    async fn grant(b: &MemoryBackend, key: &LockKey, owner: &Owner, ttl: Duration) -> crate::Grant {
        match b
            .try_acquire(&AcquireRequest::new(key.clone(), owner.clone(), ttl))
            .await
            .unwrap()
        {
            crate::Acquire::Granted(g) => g,
            held => panic!("{held:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn polling_reports_acquire_release_takeover_and_expiry() {
        let b = MemoryBackend::new();
        let key = LockKey::new("polled").unwrap();
        let (a, c) = (Owner::new("a").unwrap(), Owner::new("c").unwrap());
        let interval = Duration::from_millis(100);
        let mut w = poll_watch(
            Arc::new(b.clone()),
            key.clone(),
            interval,
            Duration::from_secs(1),
        )
        .await
        .unwrap();

        let g1 = grant(&b, &key, &a, Duration::from_secs(10)).await;
        match w.next().await.unwrap().unwrap() {
            HolderChange::Acquired(info) => assert_eq!(info.token, g1.token),
            other => panic!("{other:?}"),
        }
        b.release(&lease_of(&key, &a, &g1)).await.unwrap();
        assert_eq!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Released(lease_of(&key, &a, &g1))
        );

        // Ends between two polls and is taken at once: the old lease's
        // expiry, then the new holder.
        let g2 = grant(&b, &key, &a, Duration::from_millis(150)).await;
        assert!(matches!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Acquired(ref i) if i.token == g2.token
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let g3 = grant(&b, &key, &c, Duration::from_millis(500)).await;
        assert_eq!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Expired(lease_of(&key, &a, &g2))
        );
        assert!(matches!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Acquired(ref i) if i.token == g3.token && i.owner == c
        ));
        assert_eq!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Expired(lease_of(&key, &c, &g3))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_lease_is_no_change_and_dropping_the_watch_ends_the_task() {
        let b = MemoryBackend::new();
        let key = LockKey::new("renewed").unwrap();
        let a = Owner::new("a").unwrap();
        let g = grant(&b, &key, &a, Duration::from_millis(300)).await;
        let mut w = poll_watch(
            Arc::new(b.clone()),
            key.clone(),
            Duration::from_millis(100),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.renew(&lease_of(&key, &a, &g), Duration::from_millis(300))
                .await
                .unwrap();
        }
        b.release(&lease_of(&key, &a, &g)).await.unwrap();
        // The holder at the start is not reported; the renewals are no
        // change; the release is the first thing seen.
        assert_eq!(
            w.next().await.unwrap().unwrap(),
            HolderChange::Released(lease_of(&key, &a, &g))
        );
        let backend: Arc<dyn Backend> = Arc::new(b.clone());
        let weak = Arc::downgrade(&backend);
        let w2 = poll_watch(
            backend,
            key,
            Duration::from_millis(100),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        drop(w2);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(weak.upgrade().is_none(), "the poll task outlived its watch");
        drop(w);
    }
}
