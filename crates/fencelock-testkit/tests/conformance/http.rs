//! The conformance suite through `http://`: each case gets a `fencelock
//! serve` service of its own, in process on a loopback port, over a SQLite
//! file; every `connect` is a new HTTP client of it, as another process
//! would be. Restart stops the service and serves the file again on the
//! same port; the proxy cases cut and delay the HTTP connections.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use fencelock_core::{Backend, Fence, LockClient};
use fencelock_http::{HttpBackend, HttpFence};
use fencelock_serve::{Server, ServerHandle, Service};
use fencelock_sqlite::{SqliteBackend, SqliteFence, SqliteOptions};
use fencelock_testkit::{
    async_trait, proxy::ProxiedUrl, ProxiedBackend, Store, StoreFactory, TestResult,
};

struct Http;

struct HttpStore {
    // Removes the database when the case ends.
    _dir: tempfile::TempDir,
    db: PathBuf,
    addr: SocketAddr,
    server: tokio::sync::Mutex<Option<ServerHandle>>,
}

/// Serves the SQLite file `db` on `addr`.
async fn serve(db: &std::path::Path, addr: SocketAddr) -> TestResult<ServerHandle> {
    let options = SqliteOptions::new(db);
    let backend = Arc::new(SqliteBackend::connect_with(options.clone()).await?);
    let fence = Arc::new(SqliteFence::connect_with(options).await?);
    let service = Service::builder(LockClient::new(backend))
        .fence(fence)
        .events_interval(std::time::Duration::from_millis(50))
        .build();
    Ok(Server::bind(addr, service).await?.spawn())
}

impl HttpStore {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[async_trait]
impl Store for HttpStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(HttpBackend::connect(&self.url()).await?))
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(HttpFence::new(&self.url())?)))
    }
    async fn restart(&self) -> TestResult {
        let mut server = self.server.lock().await;
        if let Some(running) = server.take() {
            running.shutdown().await;
        }
        *server = Some(serve(&self.db, self.addr).await?);
        Ok(())
    }
    async fn connect_via_proxy(&self) -> TestResult<ProxiedBackend> {
        let proxy = ProxiedUrl::start(&self.url()).await?;
        let backend = Arc::new(HttpBackend::connect(proxy.url()).await?);
        Ok(ProxiedBackend { backend, proxy })
    }
}

#[async_trait]
impl StoreFactory for Http {
    fn name(&self) -> &'static str {
        "http"
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
    async fn store(&self, _dedicated: bool) -> TestResult<Box<dyn Store>> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("locks.db");
        let server = serve(&db, "127.0.0.1:0".parse()?).await?;
        Ok(Box::new(HttpStore {
            _dir: dir,
            db,
            addr: server.local_addr(),
            server: tokio::sync::Mutex::new(Some(server)),
        }))
    }
}

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(Http)
}
