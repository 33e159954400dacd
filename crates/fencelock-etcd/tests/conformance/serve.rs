//! The conformance suite's `fair` cases through `http://` over etcd (the
//! other cases run through a service over SQLite,
//! `crates/fencelock-testkit/tests/conformance/http.rs`): each case gets a
//! `fencelock serve` service of its own, in process on a loopback port, over
//! the case's prefix of a throwaway etcd (a server of its own for cases
//! that restart it); every `connect` is a new HTTP client of it, as another
//! process would be. etcd is fair (`docs/fairness.md`), so the `fair::`
//! cases check that waiters through the service keep their arrival order:
//! the `http://` backend claims `fair` from the service's `/v1/info` and
//! its waiting attempts leave and refresh the etcd queue entries.

use std::sync::Arc;

use fencelock_core::{Backend, Driver, Fence, LockClient};
use fencelock_http::{HttpBackend, HttpFence};
use fencelock_serve::{Server, ServerHandle, Service};
use fencelock_testkit::{
    async_trait,
    proxy::ProxiedUrl,
    servers::{etcd::EtcdCluster, url_factory::UrlServer},
    ProxiedBackend, Store, StoreFactory, TestResult,
};

struct ServeOverEtcd {
    shared: tokio::sync::OnceCell<Arc<EtcdCluster>>,
    cases: std::sync::atomic::AtomicUsize,
}

struct ServeStore {
    etcd: Arc<EtcdCluster>,
    url: String,
    _server: ServerHandle,
}

#[async_trait]
impl Store for ServeStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(HttpBackend::connect(&self.url).await?))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(HttpFence::new(&self.url)?)))
    }
    async fn restart(&self) -> TestResult {
        let etcd = Arc::clone(&self.etcd);
        tokio::task::spawn_blocking(move || etcd.restart_server()).await?
    }
    async fn connect_via_proxy(&self) -> TestResult<ProxiedBackend> {
        let proxy = ProxiedUrl::start(&self.url).await?;
        let backend = Arc::new(HttpBackend::connect(proxy.url()).await?);
        Ok(ProxiedBackend { backend, proxy })
    }
}

#[async_trait]
impl StoreFactory for ServeOverEtcd {
    fn name(&self) -> &'static str {
        "http-etcd"
    }
    fn can_restart(&self) -> bool {
        true
    }
    fn has_fence(&self) -> bool {
        true
    }
    fn can_proxy(&self) -> bool {
        true
    }
    async fn store(&self, dedicated: bool) -> TestResult<Box<dyn Store>> {
        let n = self.cases.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let etcd = if dedicated {
            Arc::new(tokio::task::spawn_blocking(EtcdCluster::start_dedicated).await??)
        } else {
            let start = || async {
                TestResult::Ok(Arc::new(
                    tokio::task::spawn_blocking(EtcdCluster::start_shared).await??,
                ))
            };
            Arc::clone(self.shared.get_or_try_init(start).await?)
        };
        let backend_url = etcd.case_url(n);
        let backend = fencelock_etcd::EtcdDriver
            .open_backend(&backend_url)
            .await?;
        let fence = fencelock_etcd::EtcdDriver.open_fence(&backend_url).await?;
        let service = Service::builder(LockClient::new(backend))
            .fence(fence)
            .events_interval(std::time::Duration::from_millis(50))
            .build();
        let server = Server::bind("127.0.0.1:0".parse()?, service).await?.spawn();
        let url = format!("http://{}", server.local_addr());
        // Without the claim the `fair::` cases would check nothing.
        if !HttpBackend::connect(&url).await?.capabilities().fair {
            return Err("the http:// backend over etcd does not claim fair".into());
        }
        Ok(Box::new(ServeStore {
            etcd,
            url,
            _server: server,
        }))
    }
}

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(ServeOverEtcd {
        shared: tokio::sync::OnceCell::new(),
        cases: std::sync::atomic::AtomicUsize::new(0),
    })
    .group("fair")
}
