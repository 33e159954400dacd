//! Writer intents: how a read-write lock keeps a stream of readers from
//! starving a writer (`docs/rwlock.md`).

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    error::Result,
    types::{LockKey, Owner},
};

/// Writer intents of a backend that claims [`crate::Capabilities::shared`],
/// offered through [`crate::Backend::write_intents`]. The client posts one
/// while an exclusive acquisition waits for readers and withdraws it when
/// the wait ends.
#[async_trait]
pub trait WriteIntents: Send + Sync {
    /// Records that `owner` waits to write `key` for the next `ttl` (backend
    /// clock): until it expires, is withdrawn or `owner` is granted `key`,
    /// new readers are refused, so that a stream of readers cannot starve a
    /// writer. An intent is a lease too: a writer that dies while waiting
    /// blocks readers for at most `ttl`. One intent per key; a later one
    /// replaces an expired one or one of the same owner, and leaves another
    /// owner's live intent in place (that writer is served first).
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()>;

    /// Withdraws `owner`'s writer intent on `key`, if it has one (a writer
    /// that stopped waiting), and wakes waiting readers.
    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()>;
}
