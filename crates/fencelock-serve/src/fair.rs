//! Fair shares of the backend between client tokens (`docs/http.md`,
//! "Threat model"): a burst of one token's requests waits for that token's
//! own earlier requests, not for the other clients'.
//!
//! A backend serves its calls through a bounded number of connections (one
//! writer for SQLite, a pool for PostgreSQL and MySQL), and calls beyond
//! those queue in arrival order. Without a bound per client, a call of one
//! client queues behind every call another has in flight: 128 connections
//! of single-key acquisitions put another client's acquire+release at 170 ms
//! p50 on SQLite, against 2.4 ms alone (`docs/http.md`). So each client token (its
//! namespace) has at most `client_concurrency` backend operations in flight
//! in each of two lanes, and the rest of its requests wait here, in order:
//!
//! - **renewals** (`renew` and batches of them), so that a client's burst
//!   of other requests does not delay its own renewals;
//! - **calls**: every other route that reaches the backend, and each
//!   acquisition's first try. A waiting acquisition queues for its first
//!   try only: its wait itself (wake-ups, retries) holds no turn, or a
//!   client's long polls would keep its other requests from running.
//!
//! Multi-key acquisitions have a share of their own, counted in keys (at
//! most one maximal acquisition of a caller in flight at once).
//!
//! The admin token, and every caller of a service without tokens, is one
//! operator, not a client to be protected from others: it takes no turns.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::Response,
    Extension,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{api::MAX_KEYS_PER_ACQUIRE, Caller, Service};

/// The default of `client_concurrency`: enough to keep a pool of connections
/// busy for one client; small enough that another client's call waits for
/// at most this many of a burst's calls.
pub(crate) const DEFAULT_CLIENT_CONCURRENCY: usize = 16;

/// Which turns a request takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lane {
    /// Single-key calls, and an acquisition's first try.
    Calls,
    /// Renewals.
    Renewals,
}

/// Every caller's share, by namespace.
#[derive(Debug)]
pub(crate) struct Shares {
    per_client: usize,
    /// Bounded by the token file's namespaces (and `""` for the admin).
    by_caller: Mutex<HashMap<String, Arc<Share>>>,
}

#[derive(Debug)]
struct Share {
    /// Keys in multi-key acquisitions at once.
    keys: Arc<Semaphore>,
    calls: Arc<Semaphore>,
    renewals: Arc<Semaphore>,
}

impl Shares {
    /// Shares that let each client have `per_client` operations in flight
    /// in each lane (at least 1).
    pub(crate) fn new(per_client: usize) -> Self {
        Self {
            per_client: per_client.clamp(1, Semaphore::MAX_PERMITS),
            by_caller: Mutex::default(),
        }
    }

    fn share(&self, caller: &Caller) -> Arc<Share> {
        let mut by_caller = self
            .by_caller
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            by_caller
                .entry(caller.namespace().unwrap_or_default().to_owned())
                .or_insert_with(|| {
                    Arc::new(Share {
                        keys: Arc::new(Semaphore::new(MAX_KEYS_PER_ACQUIRE)),
                        calls: Arc::new(Semaphore::new(self.per_client)),
                        renewals: Arc::new(Semaphore::new(self.per_client)),
                    })
                }),
        )
    }

    /// Waits for `caller`'s turn to have `keys` keys in multi-key
    /// acquisitions at once (at most one maximal acquisition a caller), so
    /// that one client's burst of them holds up the others' calls by one
    /// such step at most. Every caller, the admin too, has this share.
    pub(crate) async fn keys(&self, caller: &Caller, keys: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(keys.clamp(1, MAX_KEYS_PER_ACQUIRE)).ok()?;
        Arc::clone(&self.share(caller).keys)
            .acquire_many_owned(n)
            .await
            .ok()
    }

    /// Waits for one of a client token's turns in `lane`; `None` at once
    /// for the admin and anonymous callers, which take no turns.
    pub(crate) async fn turn(&self, caller: &Caller, lane: Lane) -> Option<OwnedSemaphorePermit> {
        caller.namespace()?;
        let share = self.share(caller);
        let semaphore = match lane {
            Lane::Calls => &share.calls,
            Lane::Renewals => &share.renewals,
        };
        // The semaphores are never closed.
        Arc::clone(semaphore).acquire_owned().await.ok()
    }
}

/// Middleware: the request runs in one of its caller's turns in the lane
/// its routes were given.
pub(crate) async fn take_turn(
    State((s, lane)): State<(Service, Lane)>,
    Extension(caller): Extension<Caller>,
    request: Request,
    next: Next,
) -> Response {
    let _turn = s.inner.shares.turn(&caller, lane).await;
    next.run(request).await
}
