//! Held leases: a lock or a leadership ([`Guard`], one class for both, as
//! the facade's [`HeldLease`]) and locks on several keys ([`MultiGuard`]).
//! Each is renewed by the client's renewer until released, lost or
//! collected; a collected one is released in the background.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
};

use chrono::{DateTime, Utc};
use fencelock::{CancellationToken, GuardHandle, HeldLease, Leadership, LockGuard};
use napi::{
    bindgen_prelude::{BigInt, Env},
    JsObject,
};
use napi_derive::napi;
use tokio::runtime::Handle;

use crate::{
    convert::{lock, millis, token_to_js},
    errors::{settle, to_js},
};

type Result<T> = napi::Result<T>;

/// A held lock or leadership (native half): renewed in the background
/// until released, lost or collected.
#[napi]
pub struct Guard {
    /// An async mutex shared with the calls in flight: `proclaim` uses the
    /// leadership across an await, and a `release` meanwhile must wait for
    /// it rather than find nothing.
    held: Arc<tokio::sync::Mutex<Option<HeldLease>>>,
    handle: GuardHandle,
    slot: Option<u32>,
    /// The binding's runtime, where a collected guard's release is sent.
    runtime: Option<Handle>,
    /// Cancelled on release or collection: ends a pending `waitLost`, so
    /// that a released or collected guard leaves no task behind.
    done: CancellationToken,
}

impl Guard {
    /// A guard of a lock; `slot` for a semaphore permit.
    pub(crate) fn lock(guard: LockGuard, slot: Option<u32>) -> Self {
        Self::new(guard.handle(), HeldLease::from(guard), slot)
    }

    /// A guard of an election's leadership.
    pub(crate) fn leader(leadership: Leadership) -> Self {
        Self::new(leadership.handle(), HeldLease::from(leadership), None)
    }

    fn new(handle: GuardHandle, held: HeldLease, slot: Option<u32>) -> Self {
        Guard {
            handle,
            held: Arc::new(tokio::sync::Mutex::new(Some(held))),
            slot,
            runtime: Handle::try_current().ok(),
            done: CancellationToken::new(),
        }
    }
}

/// Dropped by the garbage collector (the JavaScript object became
/// unreachable without `release()`): stops renewing and releases the lease
/// in the background, on the binding's runtime. A call still in flight
/// holds the lease until it ends, and its end releases it.
impl Drop for Guard {
    fn drop(&mut self) {
        self.done.cancel();
        let held = self.held.try_lock().ok().and_then(|mut held| held.take());
        drop_on(self.runtime.as_ref(), held);
    }
}

/// Drops `guard` inside `runtime`, where the Rust guard's drop sends its
/// release. When Node.js exits, napi-rs shuts the runtime down before the
/// last objects are collected: the guard then stops renewing, nothing is
/// sent, and the lease ends by expiry.
fn drop_on<G>(runtime: Option<&Handle>, guard: Option<G>) {
    match runtime {
        Some(runtime) => {
            let _entered = runtime.enter();
            drop(guard);
        }
        None => drop(guard),
    }
}

/// Settles with the loss reason, or with `null` once `done` is cancelled.
fn wait_lost(
    env: Env,
    lost: impl Future<Output = String> + Send + 'static,
    done: CancellationToken,
) -> Result<JsObject> {
    env.spawn_future(async move {
        Ok(tokio::select! {
            reason = lost => Some(reason),
            () = done.cancelled() => None,
        })
    })
}

#[napi]
impl Guard {
    /// The key.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.handle.key().as_str().to_owned()
    }

    /// The owner the lease is held as.
    #[napi(getter)]
    pub fn owner(&self) -> String {
        self.handle.owner().as_str().to_owned()
    }

    /// The grant's fencing token.
    #[napi(getter)]
    pub fn token(&self) -> BigInt {
        token_to_js(self.handle.token())
    }

    /// `'exclusive'` or `'shared'`.
    #[napi(getter)]
    pub fn mode(&self) -> String {
        self.handle.mode().as_str().to_owned()
    }

    /// The semaphore slot, for a permit.
    #[napi(getter)]
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// When the lease ends on the backend unless renewed.
    #[napi(getter)]
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.handle.expires_at()
    }

    /// Milliseconds this holder can still trust the lease (0 once lost).
    #[napi(getter)]
    pub fn remaining_ms(&self) -> f64 {
        millis(self.handle.remaining())
    }

    /// Whether the lease can still be trusted.
    #[napi(getter)]
    pub fn is_valid(&self) -> bool {
        self.handle.is_valid()
    }

    /// Why the lock was lost, once it was.
    #[napi(getter)]
    pub fn loss_reason(&self) -> Option<String> {
        self.handle.loss_reason().map(|r| r.as_str().to_owned())
    }

    /// Throws the lock-lost error once the lease cannot be trusted.
    #[napi(catch_unwind)]
    pub fn check(&self, env: Env) -> Result<()> {
        self.handle.check().map_err(|e| to_js(&env, e))
    }

    /// Renews now.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn renew(&self, env: Env) -> Result<JsObject> {
        let handle = self.handle.clone();
        settle(&env, async move { handle.renew().await })
    }

    /// Settles with the loss reason; with `null` once released.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn wait_lost(&self, env: Env) -> Result<JsObject> {
        let lost = self.handle.lost();
        wait_lost(
            env,
            async move { lost.await.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Stops renewal and releases the lease; a second call does nothing.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn release(&self, env: Env) -> Result<JsObject> {
        let held = Arc::clone(&self.held);
        let done = self.done.clone();
        settle(&env, async move {
            let held = held.lock().await.take();
            done.cancel();
            match held {
                Some(held) => held.release().await,
                None => Ok(()),
            }
        })
    }

    /// Stops renewing and leaves the lease to expire, or to `resume` by
    /// key, owner and token (in this process or another).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn detach(&self, env: Env) -> Result<JsObject> {
        let held = Arc::clone(&self.held);
        let done = self.done.clone();
        settle(&env, async move {
            let held = held.lock().await.take();
            done.cancel();
            if let Some(held) = held {
                held.detach();
            }
            Ok(())
        })
    }

    /// Publishes `value` as the leader's value (a leadership only).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn proclaim(&self, env: Env, value: serde_json::Value) -> Result<JsObject> {
        let held = Arc::clone(&self.held);
        let lease = self.handle.lease().clone();
        settle(&env, async move {
            match held.lock().await.as_ref() {
                Some(held) => held.proclaim(value).await,
                None => Err(fencelock::Error::not_held(&lease)),
            }
        })
    }
}

/// Locks on several keys, taken all or none (native half).
#[napi]
pub struct MultiGuard {
    guard: Mutex<Option<fencelock::MultiGuard>>,
    runtime: Option<Handle>,
    done: CancellationToken,
}

impl MultiGuard {
    pub(crate) fn new(guard: fencelock::MultiGuard) -> Self {
        MultiGuard {
            guard: Mutex::new(Some(guard)),
            runtime: Handle::try_current().ok(),
            done: CancellationToken::new(),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        self.done.cancel();
        drop_on(self.runtime.as_ref(), lock(&self.guard).take());
    }
}

#[napi]
impl MultiGuard {
    /// Each key's fencing token (empty once released).
    #[napi(getter)]
    pub fn tokens(&self) -> HashMap<String, BigInt> {
        lock(&self.guard)
            .as_ref()
            .map(|g| {
                g.tokens()
                    .into_iter()
                    .map(|(k, t)| (k.as_str().to_owned(), token_to_js(t)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether every lease can still be trusted.
    #[napi(getter)]
    pub fn is_valid(&self) -> bool {
        lock(&self.guard).as_ref().is_some_and(|g| g.is_valid())
    }

    /// Throws the lock-lost error once any lease cannot be trusted.
    #[napi(catch_unwind)]
    pub fn check(&self, env: Env) -> Result<()> {
        match lock(&self.guard).as_ref() {
            Some(g) => g.check().map_err(|e| to_js(&env, e)),
            None => Ok(()),
        }
    }

    /// Settles with the first loss reason; with `null` once released.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn wait_lost(&self, env: Env) -> Result<JsObject> {
        let Some(lost) = lock(&self.guard).as_ref().map(|g| g.lost()) else {
            return env.spawn_future(async { Ok(None::<String>) });
        };
        wait_lost(
            env,
            async move { lost.await.1.as_str().to_owned() },
            self.done.clone(),
        )
    }

    /// Releases every lease.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn release(&self, env: Env) -> Result<JsObject> {
        let guard = lock(&self.guard).take();
        self.done.cancel();
        settle(&env, async move {
            match guard {
                Some(guard) => guard.release().await,
                None => Ok(()),
            }
        })
    }
}
