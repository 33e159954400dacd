//! The operator's calls on the memory backend.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::{
    backend::{BackendAdmin, Stats},
    error::Result,
    types::{LeaseId, LockInfo, LockKey, Owner},
};

#[async_trait]
impl BackendAdmin for MemoryBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        let now = Instant::now();
        let state = self.state();
        let mut found: Vec<LockInfo> = state
            .all_live(now)
            .filter(|(k, _)| k.as_str().starts_with(prefix.unwrap_or("")))
            .map(|(k, l)| state.info(k, l, now))
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
        Ok(found)
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let removed = {
            let mut state = self.state();
            // Readers and a writer's intent go too: after an operator's
            // force-release the key is free for anyone.
            state.intents.remove(key);
            let readers = state.readers.remove(key).unwrap_or_default();
            let reader = readers
                .iter()
                .filter(|l| l.expires_at > now)
                .max_by_key(|l| l.token)
                .map(|l| state.info(key, l, now));
            let info = state.live(key, now).map(|l| state.info(key, l, now));
            if let Some(info) = &info {
                state.leases.remove(key);
                let lease = LeaseId::new(key.clone(), info.owner.clone(), info.token);
                self.announce_release(&state, &lease);
            }
            info.or(reader)
        };
        if let Some(info) = &removed {
            self.released(LeaseId::new(key.clone(), info.owner.clone(), info.token));
        }
        Ok(removed)
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let now = Instant::now();
        let released: Vec<LeaseId> = {
            let mut state = self.state();
            let leases: Vec<LeaseId> = state
                .leases
                .iter()
                .filter(|(_, l)| l.expires_at > now && l.owner == *owner)
                .map(|(k, l)| l.id(k))
                .collect();
            for lease in &leases {
                state.leases.remove(&lease.key);
                self.announce_release(&state, lease);
            }
            let readers: Vec<LeaseId> = state
                .readers
                .iter()
                .flat_map(|(k, ls)| ls.iter().map(move |l| (k, l)))
                .filter(|(_, l)| l.expires_at > now && l.owner == *owner)
                .map(|(k, l)| l.id(k))
                .collect();
            for lease in &readers {
                state.remove_reader(lease, now);
            }
            state.intents.retain(|_, (o, _)| o != owner);
            leases.into_iter().chain(readers).collect()
        };
        let count = released.len() as u64;
        for lease in released {
            self.released(lease);
        }
        Ok(count)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        let now = Instant::now();
        let mut state = self.state();
        let before = state.leases.len();
        state.leases.retain(|_, l| l.expires_at > now);
        let mut removed = (before - state.leases.len()) as u64;
        for readers in state.readers.values_mut() {
            let before = readers.len();
            readers.retain(|l| l.expires_at > now);
            removed += (before - readers.len()) as u64;
        }
        state.readers.retain(|_, ls| !ls.is_empty());
        state.intents.retain(|_, (_, ends)| *ends > now);
        Ok(removed)
    }

    async fn stats(&self) -> Result<Stats> {
        let now = Instant::now();
        let state = self.state();
        let live: Vec<(LockInfo, Duration)> = state
            .all_live(now)
            .map(|(k, l)| (state.info(k, l, now), now - l.acquired_at))
            .collect();
        let stored = state.leases.len() + state.readers.values().map(Vec::len).sum::<usize>();
        let expired = (stored - live.len()) as u64;
        Ok(Stats::from_leases(
            live.iter().map(|(i, d)| (i, *d)),
            expired,
        ))
    }
}
