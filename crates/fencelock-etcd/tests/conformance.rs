//! The conformance suite against throwaway `etcd` servers: one shared
//! single-member server for ordinary cases, each case under its own key
//! prefix; a server of its own for each case that restarts it.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
};

use fencelock_core::{Backend, Fence};
use fencelock_etcd::{EtcdBackend, EtcdFence};
use fencelock_testkit::{async_trait, servers::etcd::EtcdCluster, Store, StoreFactory, TestResult};

#[derive(Default)]
struct Etcd {
    shared: OnceLock<Arc<EtcdCluster>>,
    cases: AtomicUsize,
}

struct EtcdStore {
    url: String,
    server: Arc<EtcdCluster>,
}

#[async_trait]
impl Store for EtcdStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(EtcdBackend::open(&self.url).await?))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(EtcdFence::open(&self.url).await?)))
    }
    async fn restart(&self) -> TestResult {
        let server = Arc::clone(&self.server);
        tokio::task::spawn_blocking(move || server.restart()).await?
    }
}

#[async_trait]
impl StoreFactory for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
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
            Arc::new(tokio::task::spawn_blocking(EtcdCluster::start).await??)
        } else if let Some(s) = self.shared.get() {
            Arc::clone(s)
        } else {
            let s = Arc::new(tokio::task::spawn_blocking(EtcdCluster::start).await??);
            // Two cases may race here; the loser's server is dropped (killed).
            Arc::clone(self.shared.get_or_init(|| s))
        };
        Ok(Box::new(EtcdStore {
            url: format!("{}?prefix=case{n}", server.url()),
            server,
        }))
    }
}

fn main() -> ExitCode {
    // `run` owns the factory and drops it (killing the servers) before
    // returning the exit code.
    fencelock_testkit::run(Etcd::default())
}
