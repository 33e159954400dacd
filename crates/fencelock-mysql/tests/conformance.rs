//! The conformance suite against throwaway MariaDB servers: one shared
//! server for the binary, a fresh table prefix per case, and a server of its
//! own for each case that restarts it.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use fencelock_core::{Backend, Fence};
use fencelock_mysql::{MySqlBackend, MySqlFence};
use fencelock_testkit::{
    async_trait, servers::mariadb::MariaDbServer, Store, StoreFactory, TestResult,
};

type Shared = Arc<Mutex<Option<MariaDbServer>>>;

struct Factory {
    shared: Shared,
    next: AtomicUsize,
}

struct MyStore {
    url: String,
    /// Only for dedicated stores: the server this case may restart.
    own: Option<Arc<Mutex<MariaDbServer>>>,
}

#[async_trait]
impl Store for MyStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(MySqlBackend::connect(&self.url).await?))
    }

    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(Some(Arc::new(MySqlFence::connect(&self.url).await?)))
    }

    async fn restart(&self) -> TestResult {
        let server = Arc::clone(
            self.own
                .as_ref()
                .ok_or("a shared server is not restarted")?,
        );
        tokio::task::spawn_blocking(move || {
            server.lock().map_err(|_| "server lock poisoned")?.restart()
        })
        .await?
    }
}

#[async_trait]
impl StoreFactory for Factory {
    fn name(&self) -> &'static str {
        "mariadb"
    }
    fn can_restart(&self) -> bool {
        true
    }
    fn has_fence(&self) -> bool {
        true
    }
    async fn store(&self, dedicated: bool) -> TestResult<Box<dyn Store>> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("c{n}_");
        if dedicated {
            let server = tokio::task::spawn_blocking(MariaDbServer::start).await??;
            let url = format!("{}?table_prefix={prefix}", server.url("mysql"));
            return Ok(Box::new(MyStore {
                url,
                own: Some(Arc::new(Mutex::new(server))),
            }));
        }
        let shared = Arc::clone(&self.shared);
        let base = tokio::task::spawn_blocking(move || -> TestResult<String> {
            let mut slot = shared.lock().map_err(|_| "server lock poisoned")?;
            if slot.is_none() {
                *slot = Some(MariaDbServer::start()?);
            }
            Ok(slot.as_ref().ok_or("no server")?.url("mysql"))
        })
        .await??;
        Ok(Box::new(MyStore {
            url: format!("{base}?table_prefix={prefix}&pool_max=4"),
            own: None,
        }))
    }
}

fn main() -> ExitCode {
    let shared: Shared = Arc::default();
    let code = fencelock_testkit::run(Factory {
        shared: Arc::clone(&shared),
        next: AtomicUsize::new(0),
    });
    // Stop the shared server before the process exits: statics are never
    // dropped, and a leaked mariadbd would outlive the test run.
    if let Ok(mut slot) = shared.lock() {
        slot.take();
    }
    code
}
