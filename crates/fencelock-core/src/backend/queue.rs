//! The queue of waiters behind a fair backend (`docs/fairness.md`).

use async_trait::async_trait;

use crate::{
    error::Result,
    types::{LockInfo, LockKey, Owner},
};

/// The waiters' queue of a backend that claims
/// [`crate::Capabilities::fair`], offered through
/// [`crate::Backend::fair_queue`].
///
/// A waiting exclusive attempt ([`crate::AcquireRequest::queue`]) leaves or
/// refreshes its owner's entry, ordered by the engine itself (etcd create
/// revisions, ZooKeeper sequential nodes), and a grant goes only to the
/// oldest live entry and removes it.
#[async_trait]
pub trait FairQueue: Send + Sync {
    /// Withdraws `owner`'s queue entry on `key`, if it has one: its waiting
    /// acquisition ended without a grant (deadline passed, or the wait was
    /// dropped).
    async fn leave_queue(&self, key: &LockKey, owner: &Owner) -> Result<()>;

    /// The live queue entries of `key`, oldest (next to be granted) first:
    /// each waiter's owner, the entry's position token and the time its
    /// entry has left (`expires_in`) on the backend's clock.
    async fn queue(&self, key: &LockKey) -> Result<Vec<LockInfo>>;
}
