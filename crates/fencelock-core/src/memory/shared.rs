//! The memory backend's read-write locks (`docs/rwlock.md`): readers'
//! leases beside the writers', and the writer intents that hold new
//! readers back.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Lease, MemoryBackend};
use crate::{
    backend::{Acquire, AcquireRequest, Grant, WriteIntents},
    error::{Error, Result},
    types::{LeaseId, LockKey, Owner},
};

/// The reader's side of a read-write lock (`docs/rwlock.md`).
impl MemoryBackend {
    pub(super) fn acquire_reader(&self, request: &AcquireRequest) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(holder) = state.live(&request.key, now) {
            return Ok(Acquire::Held(Some(state.info(&request.key, holder, now))));
        }
        if state
            .intents
            .get(&request.key)
            .is_some_and(|(_, ends)| *ends > now)
        {
            return Ok(Acquire::Held(None));
        }
        let token = state.next_token(request)?;
        let lease = Lease::of(request, token, now);
        let expires_at = lease.expires_at;
        let readers = state.readers.entry(request.key.clone()).or_default();
        readers.retain(|l| l.expires_at > now);
        readers.push(lease);
        Ok(Acquire::Granted(Grant::new(
            token,
            request.ttl,
            state.wall(expires_at),
        )))
    }

    pub(super) fn renew_reader(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let now = Instant::now();
        let mut state = self.state();
        let expires_at = now + ttl;
        match state.reader_mut(lease, now) {
            Some(held) => held.expires_at = expires_at,
            None => return Err(Error::not_held(lease)),
        }
        Ok(Grant::new(lease.token, ttl, state.wall(expires_at)))
    }

    pub(super) fn release_reader(&self, lease: &LeaseId) -> Result<()> {
        let now = Instant::now();
        if !self.state().remove_reader(lease, now) {
            return Err(Error::not_held(lease));
        }
        self.released(lease.clone());
        Ok(())
    }
}

#[async_trait]
impl WriteIntents for MemoryBackend {
    async fn post_write_intent(&self, key: &LockKey, owner: &Owner, ttl: Duration) -> Result<()> {
        let now = Instant::now();
        let mut state = self.state();
        let taken = state
            .intents
            .get(key)
            .is_some_and(|(other, ends)| *ends > now && other != owner);
        if !taken {
            state
                .intents
                .insert(key.clone(), (owner.clone(), now + ttl));
        }
        Ok(())
    }

    async fn withdraw_write_intent(&self, key: &LockKey, owner: &Owner) -> Result<()> {
        let withdrawn = {
            let mut state = self.state();
            let mine = state.intents.get(key).is_some_and(|(o, _)| o == owner);
            if mine {
                state.intents.remove(key);
            }
            mine
        };
        if withdrawn {
            self.wakeups.notify(key.as_str());
        }
        Ok(())
    }
}
