//! The conformance suite against throwaway `redis-server`s: one shared
//! server (no persistence) for ordinary cases, each case under its own key
//! prefix; a persistent server of its own for each case that restarts it.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
};

use fencelock_core::{Backend, Fence};
use fencelock_redis::{RedisBackend, RedisFence};
use fencelock_testkit::{
    async_trait, servers::redis::RedisServer, Store, StoreFactory, TestResult,
};

#[derive(Default)]
struct Redis {
    shared: OnceLock<Arc<RedisServer>>,
    cases: AtomicUsize,
}

impl Redis {
    fn shared(&self) -> TestResult<Arc<RedisServer>> {
        if let Some(s) = self.shared.get() {
            return Ok(Arc::clone(s));
        }
        let server = Arc::new(RedisServer::start()?);
        // Two cases may race here; the loser's server is dropped (killed).
        Ok(Arc::clone(self.shared.get_or_init(|| server)))
    }
}

struct RedisStore {
    url: String,
    server: Arc<RedisServer>,
}

#[async_trait]
impl Store for RedisStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(RedisBackend::open(&self.url).await?))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(RedisFence::open(&self.url).await?)))
    }
    async fn restart(&self) -> TestResult {
        let server = Arc::clone(&self.server);
        tokio::task::spawn_blocking(move || server.restart()).await?
    }
}

#[async_trait]
impl StoreFactory for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn can_restart(&self) -> bool {
        true
    }
    fn has_fence(&self) -> bool {
        true
    }
    async fn store(&self, dedicated: bool) -> TestResult<Box<dyn Store>> {
        let n = self.cases.fetch_add(1, Ordering::SeqCst);
        let server = if dedicated {
            Arc::new(tokio::task::spawn_blocking(RedisServer::start_persistent).await??)
        } else {
            self.shared()?
        };
        Ok(Box::new(RedisStore {
            url: format!("{}?prefix=case{n}", server.url(0)),
            server,
        }))
    }
}

fn main() -> ExitCode {
    // `run` owns the factory and drops it (killing the servers) before
    // returning the exit code.
    fencelock_testkit::run(Redis::default())
}
