//! [`HeldLease`]: a lock or a leadership behind one type, for code that
//! hands either out as the same object (the Node.js and Python packages'
//! guards).

use crate::{Error, GuardHandle, Leadership, LockGuard, Result};

/// A held lease that is either a lock or an election's leadership.
///
/// Language bindings give both to their callers as one guard class: the
/// token, the loss signal and the release are the same, and only a
/// leadership can publish a value. Dropping it releases (or resigns) in the
/// background, as dropping the guard inside does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), fencelock::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = format!("sqlite://{}", dir.path().join("locks.db").display());
/// use fencelock::HeldLease;
///
/// let client = fencelock::connect(&url).await?;
/// let lock = HeldLease::from(client.lock("order:123").acquire().await?);
/// let leader = HeldLease::from(client.election("scheduler").campaign().await?);
/// assert!(lock.handle().token() > fencelock::FencingToken(0));
/// // Only the leadership publishes a value.
/// assert!(lock.proclaim(serde_json::json!("x")).await.is_err());
/// leader.proclaim(serde_json::json!({"addr": "10.0.0.7"})).await?;
/// lock.release().await?;
/// leader.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "dropping a held lease releases it in the background"]
pub enum HeldLease {
    /// A lock: exclusive, a reader's or writer's, or a semaphore permit.
    Lock(LockGuard),
    /// An election's leadership: a lock that can also publish the
    /// leader's value.
    Leader(Leadership),
}

impl HeldLease {
    /// A cloneable handle to the lease (key, token, validity, loss signal).
    pub fn handle(&self) -> GuardHandle {
        match self {
            HeldLease::Lock(guard) => guard.handle(),
            HeldLease::Leader(leadership) => leadership.handle(),
        }
    }

    /// Stops renewing and releases the lease (a leadership resigns, so
    /// that a standby is elected at once).
    pub async fn release(self) -> Result<()> {
        match self {
            HeldLease::Lock(guard) => guard.release().await,
            HeldLease::Leader(leadership) => leadership.resign().await,
        }
    }

    /// Stops renewing and leaves the lease to expire, or to
    /// [`LockClient::resume`](crate::LockClient::resume) by key, owner and
    /// token.
    pub fn detach(self) {
        match self {
            HeldLease::Lock(guard) => guard.detach(),
            HeldLease::Leader(leadership) => leadership.into_guard().detach(),
        }
    }

    /// Publishes `value` as the leader's value
    /// ([`Leadership::proclaim`]); [`Error::InvalidArgument`] for a lock.
    pub async fn proclaim(&self, value: serde_json::Value) -> Result<()> {
        match self {
            HeldLease::Leader(leadership) => leadership.proclaim(value).await,
            HeldLease::Lock(_) => Err(Error::InvalidArgument(
                "only an election's leadership can proclaim".into(),
            )),
        }
    }
}

impl From<LockGuard> for HeldLease {
    fn from(guard: LockGuard) -> Self {
        HeldLease::Lock(guard)
    }
}

impl From<Leadership> for HeldLease {
    fn from(leadership: Leadership) -> Self {
        HeldLease::Leader(leadership)
    }
}
