//! The conformance suite against the in-process memory backend.

use std::sync::Arc;

use fencelock_core::{Backend, Fence, MemoryBackend, MemoryFence};
use fencelock_testkit::{async_trait, Store, StoreFactory, TestResult};

struct Memory;

struct MemoryStore {
    backend: MemoryBackend,
    fence: MemoryFence,
}

#[async_trait]
impl Store for MemoryStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(self.backend.clone()))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(self.fence.clone())))
    }
}

#[async_trait]
impl StoreFactory for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn can_restart(&self) -> bool {
        false
    }
    fn has_fence(&self) -> bool {
        true
    }
    async fn store(&self, _dedicated: bool) -> TestResult<Box<dyn Store>> {
        Ok(Box::new(MemoryStore {
            backend: MemoryBackend::new(),
            fence: MemoryFence::new(),
        }))
    }
}

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(Memory)
}
