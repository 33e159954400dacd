//! All-or-nothing locks on several keys (`docs/multi-key.md`).
//!
//! Keys are taken one after another in sorted order: two callers whose key
//! sets overlap meet on their lowest common key first, so one of them waits
//! there while holding nothing the other needs, and neither can deadlock
//! the other, whatever order their callers listed the keys in.

use std::{collections::BTreeSet, fmt, future::Future, time::Duration};

use futures_util::future::{join_all, select_all};
use serde_json::Value;
use tokio::time::Instant;

use crate::{
    client::{LockClient, LockRequest},
    error::{Error, LossReason, Result},
    guard::LockGuard,
    types::{FencingToken, LockKey},
};

impl LockClient {
    /// Starts building an acquisition of every key in `keys`, all or
    /// nothing. Keys are sorted and de-duplicated; an empty list is
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use fencelock_core::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let client = LockClient::new(Arc::new(MemoryBackend::new()));
    /// let all = client.lock_all(["account:2", "account:1"]).acquire().await?;
    /// assert_eq!(all.keys()[0].as_str(), "account:1");
    /// let token = all.token("account:2").expect("held");
    /// assert!(token.get() > 0);
    /// all.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLockRequest<'_>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLockRequest {
            keys: keys.into_iter().map(Into::into).collect(),
            parts: self.lock(String::new()),
        }
    }
}

/// An all-or-nothing acquisition being built:
/// `client.lock_all(keys).ttl(..).wait(..).acquire()`.
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct MultiLockRequest<'a> {
    keys: BTreeSet<String>,
    /// The options every part is taken with (its key is not used).
    parts: LockRequest<'a>,
}

impl MultiLockRequest<'_> {
    /// Lease length of every part.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.parts = self.parts.ttl(ttl);
        self
    }

    /// How long the whole call may wait (default: not at all): one deadline
    /// shared by every key, not a wait per key.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.parts = self.parts.wait(wait);
        self
    }

    /// A label stored with every part's lease.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.parts = self.parts.kind(kind);
        self
    }

    /// JSON metadata stored with every part's lease.
    pub fn data(mut self, data: Value) -> Self {
        self.parts = self.parts.data(data);
        self
    }

    /// Renewal period of every part (default: a third of the TTL).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.parts = self.parts.renew_every(period);
        self
    }

    /// The request for one part, waiting at most `wait`.
    fn part(&self, key: &str, wait: Duration) -> LockRequest<'_> {
        self.parts.for_key(key.to_owned()).wait(wait)
    }

    /// Takes every key, in sorted order, each waiting within what is left of
    /// the one deadline. On any failure every part already taken is released
    /// before the error returns: [`Error::Timeout`] (naming the key that was
    /// held elsewhere, and the whole wait) or the part's own error.
    pub async fn acquire(self) -> Result<MultiGuard> {
        if self.keys.is_empty() {
            return Err(Error::InvalidArgument(
                "lock_all needs at least one key".into(),
            ));
        }
        // Every key and option is checked before anything is taken.
        for key in &self.keys {
            self.part(key, Duration::ZERO).validate()?;
        }
        let deadline = Instant::now().checked_add(self.parts.wait);
        let mut guards: Vec<LockGuard> = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match self.part(key, left).acquire().await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    release_parts(guards).await;
                    return Err(match e {
                        Error::Timeout { key, .. } => Error::Timeout {
                            key,
                            waited: self.parts.wait,
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// One attempt at every key, no waiting: `Ok(None)` when some key is
    /// held elsewhere (and nothing stays held).
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Gives back the parts of a failed acquisition, all at once; a part whose
/// release fails ends by expiry.
async fn release_parts(guards: Vec<LockGuard>) {
    for result in join_all(guards.into_iter().map(LockGuard::release)).await {
        if let Err(e) = result {
            tracing::debug!(error = %e, "could not release a part; it will expire");
        }
    }
}

/// Several held locks, valid only while every one of them is.
///
/// Dropping it releases every part in the background, like a guard.
#[must_use = "dropping a guard releases the locks"]
pub struct MultiGuard {
    /// Sorted by key.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The keys, sorted.
    pub fn keys(&self) -> Vec<LockKey> {
        self.guards.iter().map(|g| g.key().clone()).collect()
    }

    /// Each key's fencing token, sorted by key: fence each key's resource
    /// with its own token.
    pub fn tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.key().clone(), g.token()))
            .collect()
    }

    /// The token of `key`, if it is one of this guard's keys.
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.key().as_str() == key)
            .map(|g| g.token())
    }

    /// The guard of each part, sorted by key.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every part is still trusted.
    pub fn is_valid(&self) -> bool {
        self.guards.iter().all(|g| g.is_valid())
    }

    /// `Ok` while every part is trusted; the first part's
    /// [`Error::LockLost`] otherwise.
    pub fn check(&self) -> Result<()> {
        self.guards.iter().try_for_each(|g| g.check())
    }

    /// How long every part is still trusted (the least of them).
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|g| g.remaining())
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Completes when ANY part is lost, with that part's key and reason.
    pub fn lost(&self) -> impl Future<Output = (LockKey, LossReason)> + Send + 'static {
        let parts: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let key = g.key().clone();
                let lost = g.lost();
                Box::pin(async move { (key, lost.await) })
            })
            .collect();
        async move {
            if parts.is_empty() {
                // Never the case (`acquire` refuses an empty list); a guard
                // of nothing is never lost.
                return std::future::pending().await;
            }
            select_all(parts).await.0
        }
    }

    /// Stops renewal and releases every part now, concurrently. The first
    /// failure is returned after all have been tried.
    pub async fn release(self) -> Result<()> {
        let results = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("parts", &self.guards)
            .finish()
    }
}
