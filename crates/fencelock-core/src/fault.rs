//! Fault injection at the [`Backend`] seam: a wrapper that passes calls
//! through, fails them as transient errors, leaves them hanging, or delays
//! their answers, switched at run time. Guard tests use it with the memory
//! backend and a paused tokio clock to reproduce an unreachable backend
//! deterministically; the test kit's shared cases use it on real backends.
//!
//! Test-only: compiled with the `test-util` feature, never by default.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use async_trait::async_trait;

use crate::{
    Acquire, AcquireAll, AcquireRequest, Backend, BackendAdmin, BackendError, Capabilities,
    ErrorStatus, FairQueue, Grant, LeaseId, LockInfo, LockKey, Owner, Renewal, Result, Stats,
    WakeSubscription, Watch, WriteIntents,
};

/// How the wrapped backend behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Calls go through.
    None = 0,
    /// Calls fail at once with a transient error (connection refused).
    Refuse = 1,
    /// Calls never answer (a blackholed network).
    Hang = 2,
    /// Renewals fail at once with a transient error; every other call goes
    /// through (a backend that answers but cannot extend leases).
    RefuseRenewals = 3,
}

/// A backend whose calls can be made to fail or hang.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    fault: AtomicU8,
    reply_delay_us: AtomicU64,
    renew_calls: AtomicUsize,
    renew_batches: AtomicUsize,
    list_calls: AtomicUsize,
    failing_lists: AtomicUsize,
    inspect_calls: AtomicUsize,
}

impl FaultyBackend {
    /// Wraps `inner`, initially healthy.
    pub fn new(inner: Arc<dyn Backend>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            fault: AtomicU8::new(Fault::None as u8),
            reply_delay_us: AtomicU64::new(0),
            renew_calls: AtomicUsize::new(0),
            renew_batches: AtomicUsize::new(0),
            list_calls: AtomicUsize::new(0),
            failing_lists: AtomicUsize::new(0),
            inspect_calls: AtomicUsize::new(0),
        })
    }

    /// Switches the fault.
    pub fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }

    /// Delays every answer by `delay` *after* the wrapped backend acted: a
    /// slow way back, so the caller learns late what already happened.
    pub fn set_reply_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.reply_delay_us.store(micros, Ordering::SeqCst);
    }

    /// How many leases this wrapper was asked to renew, one by one or in
    /// batches (faulty or not).
    pub fn renew_calls(&self) -> usize {
        self.renew_calls.load(Ordering::SeqCst)
    }

    /// Makes the next `n` calls of `list` fail at once with a transient
    /// error (a connection reset), whatever the fault; other calls go on.
    pub fn fail_lists(&self, n: usize) {
        self.failing_lists.store(n, Ordering::SeqCst);
    }

    /// How many `list` calls reached this wrapper (failed or not).
    pub fn list_calls(&self) -> usize {
        self.list_calls.load(Ordering::SeqCst)
    }

    /// How many `inspect` calls reached this wrapper (failed or not).
    pub fn inspect_calls(&self) -> usize {
        self.inspect_calls.load(Ordering::SeqCst)
    }

    /// How many `renew_many` batches reached this wrapper.
    pub fn renew_batches(&self) -> usize {
        self.renew_batches.load(Ordering::SeqCst)
    }

    fn gate_renewal(&self) -> Result<()> {
        if self.fault.load(Ordering::SeqCst) == Fault::RefuseRenewals as u8 {
            return Err(BackendError::message(
                "faulty",
                ErrorStatus::Transient,
                "injected: renewal refused",
            )
            .into());
        }
        Ok(())
    }

    async fn gate(&self) -> Result<()> {
        match self.fault.load(Ordering::SeqCst) {
            1 => Err(BackendError::message(
                "faulty",
                ErrorStatus::Transient,
                "injected: connection refused",
            )
            .into()),
            2 => {
                // Far longer than any test runs; dropped by the caller's deadline.
                tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
                Err(
                    BackendError::message("faulty", ErrorStatus::Transient, "injected: hang")
                        .into(),
                )
            }
            _ => Ok(()),
        }
    }

    /// Runs one call of the wrapped backend under the current faults.
    async fn call<T>(&self, inner: impl Future<Output = Result<T>>) -> Result<T> {
        self.gate().await?;
        let answer = inner.await;
        let delay = self.reply_delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        answer
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.call(self.inner.try_acquire(request)).await
    }
    async fn try_acquire_waiting(
        &self,
        request: &AcquireRequest,
        wait: Duration,
    ) -> Result<Acquire> {
        self.call(self.inner.try_acquire_waiting(request, wait))
            .await
    }
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        self.call(self.inner.try_acquire_all(requests)).await
    }
    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.gate_renewal()?;
        self.call(self.inner.renew(lease, ttl)).await
    }
    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        self.renew_calls.fetch_add(renewals.len(), Ordering::SeqCst);
        self.renew_batches.fetch_add(1, Ordering::SeqCst);
        self.gate_renewal()?;
        self.call(self.inner.renew_many(renewals)).await
    }
    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.call(self.inner.release(lease)).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inspect_calls.fetch_add(1, Ordering::SeqCst);
        self.call(self.inner.inspect(key)).await
    }
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        self.call(self.inner.subscribe(key)).await
    }
    async fn watch(&self, key: &LockKey) -> Result<Watch> {
        self.call(self.inner.watch(key)).await
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        self.call(self.inner.set_data(lease, data)).await
    }

    fn admin(&self) -> Option<&dyn BackendAdmin> {
        self.inner.admin().map(|_| self as &dyn BackendAdmin)
    }

    // Queues and writer intents pass through without faults: what the
    // wrapper tests is the lease operations.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.inner.fair_queue()
    }

    fn write_intents(&self) -> Option<&dyn WriteIntents> {
        self.inner.write_intents()
    }
}

#[async_trait]
impl BackendAdmin for FaultyBackend {
    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.list_calls.fetch_add(1, Ordering::SeqCst);
        let fail = self
            .failing_lists
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(BackendError::message(
                "faulty",
                ErrorStatus::Transient,
                "injected: list reset",
            )
            .into());
        }
        self.call(self.inner.administer()?.list(prefix)).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.call(self.inner.administer()?.force_release(key)).await
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        self.call(self.inner.administer()?.release_all(owner)).await
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        self.call(self.inner.administer()?.cleanup_expired()).await
    }

    async fn stats(&self) -> Result<Stats> {
        self.call(self.inner.administer()?.stats()).await
    }
}
