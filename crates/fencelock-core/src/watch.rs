//! Holder changes of one key: what election observers and live views follow.
//!
//! A [`Watch`] is a stream of [`HolderChange`]s fed by the backend. It reports
//! expiries as well as releases, so an observer learns of a vacancy when a
//! crashed holder's lease runs out, not only when a holder lets go.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::Stream;
use tokio::sync::mpsc;

use crate::{
    error::Result,
    types::{LeaseId, LockInfo},
};

/// How the holder of a key changed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HolderChange {
    /// A new lease was granted.
    Acquired(LockInfo),
    /// The lease was released by its holder or force-released.
    Released(LeaseId),
    /// The lease reached its end on the backend's clock without renewal.
    Expired(LeaseId),
}

/// How many changes a watch buffers before the backend's feeder waits for the
/// reader.
const WATCH_BUFFER: usize = 64;

/// A stream of [`HolderChange`]s of one key, from [`crate::Backend::watch`].
///
/// Read it with [`Watch::next`] or as a [`Stream`]. It ends (`None`) when the
/// backend stops feeding it; an `Err` item reports why before the end when
/// the backend knows. Dropping it stops the backend's feeder.
pub struct Watch {
    changes: mpsc::Receiver<Result<HolderChange>>,
}

/// The backend's end of a [`Watch`].
#[derive(Clone, Debug)]
pub struct WatchFeeder {
    changes: mpsc::Sender<Result<HolderChange>>,
}

impl Watch {
    /// A watch and the feeder a backend sends changes into (typically from
    /// a task that ends when [`WatchFeeder::closed`] completes).
    pub fn channel() -> (WatchFeeder, Watch) {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        (WatchFeeder { changes: tx }, Watch { changes: rx })
    }

    /// The next change; `None` once the feeder is gone.
    pub async fn next(&mut self) -> Option<Result<HolderChange>> {
        self.changes.recv().await
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Stream for Watch {
    type Item = Result<HolderChange>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.changes.poll_recv(cx)
    }
}

impl WatchFeeder {
    /// Delivers `change`; `false` when the watch was dropped (stop feeding).
    pub async fn send(&self, change: Result<HolderChange>) -> bool {
        self.changes.send(change).await.is_ok()
    }

    /// Completes when the watch is dropped.
    pub async fn closed(&self) {
        self.changes.closed().await;
    }
}
