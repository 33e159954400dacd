//! The engine's own limit, for `fencelock bench --baseline`: one lock cycle
//! (acquire, then release) done with the backend's own statements, scripts
//! or RPCs on a raw driver connection, with none of the library around it
//! (no pool, no guard, no renewer, no metrics). Each backend crate
//! implements it next to the code it mirrors, so the baseline cannot drift
//! from what the library sends. Not a stable API.

use std::time::Duration;

use async_trait::async_trait;

use crate::{backend::Acquire, error::Result, AcquireRequest, Backend, FencingToken, LockKey};

/// The owner every raw cycle acquires as, on every engine.
pub const RAW_OWNER: &str = "fencelock-bench-raw";

/// The request a raw cycle makes for `key`: [`RAW_OWNER`], no kind or data.
pub fn raw_request(key: &str, ttl: Duration) -> Result<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockKey::new(key)?,
        crate::Owner::new(RAW_OWNER)?,
        ttl,
    ))
}

/// The token of a granted acquisition, in [`RawCycle::acquire`]'s terms.
pub fn granted_token(acquired: Acquire) -> Option<u64> {
    match acquired {
        Acquire::Granted(grant) => Some(grant.token.get()),
        Acquire::Held(_) => None,
    }
}

/// One raw connection (or a handle on one shared connection, where the
/// library shares one too) doing lock cycles.
#[async_trait]
pub trait RawCycle: Send {
    /// One raw acquisition of `key`: `Some(token)` if granted, `None` if
    /// another holder has it.
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>>;

    /// Releases `key` granted with `token`; `false` if it was not held.
    async fn release(&mut self, key: &str, token: u64) -> Result<bool>;
}

/// Opens [`RawCycle`]s on one engine, configured as the library's backend
/// for the same URL.
#[async_trait]
pub trait RawBaseline: Send + Sync {
    /// What one raw cycle sends, for the report.
    fn describe(&self) -> String;

    /// A worker for one benchmark client.
    async fn worker(&self) -> Result<Box<dyn RawCycle>>;
}

/// The baseline of backends whose operations are plain calls already (the
/// in-process memory backend): the `Backend` methods without the client.
pub struct DirectBaseline {
    backend: std::sync::Arc<dyn Backend>,
    owner: crate::Owner,
}

impl DirectBaseline {
    /// Cycles on `backend` directly.
    pub fn new(backend: std::sync::Arc<dyn Backend>) -> Result<Self> {
        Ok(Self {
            backend,
            owner: crate::Owner::new(RAW_OWNER)?,
        })
    }
}

struct Direct {
    backend: std::sync::Arc<dyn Backend>,
    owner: crate::Owner,
}

#[async_trait]
impl RawCycle for Direct {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let request = raw_request(key, ttl)?;
        Ok(granted_token(self.backend.try_acquire(&request).await?))
    }

    async fn release(&mut self, key: &str, token: u64) -> Result<bool> {
        let lease =
            crate::LeaseId::new(LockKey::new(key)?, self.owner.clone(), FencingToken(token));
        match self.backend.release(&lease).await {
            Ok(()) => Ok(true),
            Err(crate::Error::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl RawBaseline for DirectBaseline {
    fn describe(&self) -> String {
        format!(
            "Backend::try_acquire + release on the {} backend, without LockClient",
            self.backend.name()
        )
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Direct {
            backend: std::sync::Arc::clone(&self.backend),
            owner: self.owner.clone(),
        }))
    }
}
