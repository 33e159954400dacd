//! A [`StoreFactory`] for backends opened by URL against throwaway servers:
//! one shared server per test binary (started lazily, stopped when the
//! factory is dropped at the end of [`crate::run`]), each case isolated by a
//! URL option of its own (a key or table prefix), and a server of its own for
//! each case that restarts it.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use async_trait::async_trait;
use fencelock_core::{Backend, Fence};
use futures_util::future::BoxFuture;

use crate::{proxy::ProxiedUrl, suite::ProxiedBackend, Store, StoreFactory, TestResult};

/// A throwaway server the factory can start, address and restart.
pub trait UrlServer: Send + Sync + 'static + Sized {
    /// Starts the server shared by ordinary cases.
    fn start_shared() -> TestResult<Self>;
    /// Starts a server for one case that will restart it (e.g. with
    /// persistence turned on).
    fn start_dedicated() -> TestResult<Self>;
    /// The backend URL without query options.
    fn url(&self) -> String;
    /// The URL of case number `case`'s private store on this server (by
    /// default a `prefix=` option: the key prefix of Redis and etcd).
    fn case_url(&self, case: usize) -> String {
        format!("{}?prefix=case{case}", self.url())
    }
    /// Stops and starts the server again, keeping what it persists.
    fn restart_server(&self) -> TestResult;
    /// Whether a TCP proxy in front of [`UrlServer::url`] carries all of
    /// a backend's traffic (not so for a cluster, whose client connects
    /// to the nodes it discovers).
    fn can_proxy() -> bool {
        true
    }
    /// The URL option that bounds each request, if the backend has one
    /// whose default is [`REQUEST_TIMEOUT`]: the factory lengthens it by the
    /// budget measured for the case ([`crate::patience`]), so that a busy
    /// machine's slow server is a slow case, not a false time-out.
    const REQUEST_TIMEOUT_OPTION: Option<&'static str> = None;
}

/// The default per-request bound of the backends that name a
/// [`UrlServer::REQUEST_TIMEOUT_OPTION`] (ZooKeeper's, etcd's and Redis's
/// `timeout=`).
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `url` with `option` set to the current budget's share of
/// [`REQUEST_TIMEOUT`], or unchanged on a quiet machine (the default then
/// stands, as users get it).
fn with_patient_timeout(url: String, option: &str) -> String {
    let timeout = crate::patience::current().bound(REQUEST_TIMEOUT);
    if timeout <= REQUEST_TIMEOUT {
        return url;
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{option}={}ms", timeout.as_millis())
}

/// A relational server (PostgreSQL, MariaDB) whose cases share it behind a
/// mutex, which lets a shared handle restart it; each case gets its own
/// table prefix.
pub trait SqlServer: Send + 'static + Sized {
    /// The database the suite's URLs name.
    const DATABASE: &'static str;
    /// Starts a server for tests.
    fn start() -> TestResult<Self>;
    /// A URL for database `db`.
    fn url(&self, db: &str) -> String;
    /// Stops the server and starts it again on the same port and data.
    fn restart(&mut self) -> TestResult;
}

impl<S: SqlServer> UrlServer for std::sync::Mutex<S> {
    fn start_shared() -> TestResult<Self> {
        Ok(std::sync::Mutex::new(S::start()?))
    }
    fn start_dedicated() -> TestResult<Self> {
        Self::start_shared()
    }
    fn url(&self) -> String {
        self.lock()
            .map(|server| server.url(S::DATABASE))
            .unwrap_or_else(|poisoned| poisoned.into_inner().url(S::DATABASE))
    }
    fn case_url(&self, case: usize) -> String {
        format!("{}?table_prefix=c{case}_&pool_max=4", self.url())
    }
    fn restart_server(&self) -> TestResult {
        self.lock()
            .map_err(|_| "a restart of this server panicked")?
            .restart()
    }
}

/// Opens a backend or fence from a URL: the crate's `open_backend` /
/// `open_fence` entry points.
pub type Opener<T> = fn(String) -> BoxFuture<'static, fencelock_core::Result<Arc<T>>>;

/// See the module docs.
pub struct UrlFactory<S> {
    name: &'static str,
    backend: Opener<dyn Backend>,
    fence: Option<Opener<dyn Fence>>,
    /// Started by the first case that needs it; cases arriving meanwhile
    /// wait for that start instead of starting servers of their own.
    shared: tokio::sync::OnceCell<Arc<S>>,
    cases: AtomicUsize,
}

impl<S: UrlServer> UrlFactory<S> {
    /// A factory named `name` opening backends (and fences) with the given
    /// functions.
    pub fn new(
        name: &'static str,
        backend: Opener<dyn Backend>,
        fence: Option<Opener<dyn Fence>>,
    ) -> Self {
        Self {
            name,
            backend,
            fence,
            shared: tokio::sync::OnceCell::new(),
            cases: AtomicUsize::new(0),
        }
    }
}

struct UrlStore<S> {
    url: String,
    server: Arc<S>,
    backend: Opener<dyn Backend>,
    fence: Option<Opener<dyn Fence>>,
}

#[async_trait]
impl<S: UrlServer> Store for UrlStore<S> {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok((self.backend)(self.url.clone()).await?)
    }
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        match self.fence {
            Some(open) => Ok(Some(open(self.url.clone()).await?)),
            None => Ok(None),
        }
    }
    async fn restart(&self) -> TestResult {
        let server = Arc::clone(&self.server);
        tokio::task::spawn_blocking(move || server.restart_server()).await?
    }
    async fn connect_via_proxy(&self) -> TestResult<ProxiedBackend> {
        let proxy = ProxiedUrl::start(&self.url).await?;
        let backend = (self.backend)(proxy.url().to_owned()).await?;
        Ok(ProxiedBackend { backend, proxy })
    }
}

#[async_trait]
impl<S: UrlServer> StoreFactory for UrlFactory<S> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn can_restart(&self) -> bool {
        true
    }
    fn has_fence(&self) -> bool {
        self.fence.is_some()
    }
    fn can_proxy(&self) -> bool {
        S::can_proxy()
    }
    async fn store(&self, dedicated: bool) -> TestResult<Box<dyn Store>> {
        let n = self.cases.fetch_add(1, Ordering::SeqCst);
        let server = if dedicated {
            Arc::new(tokio::task::spawn_blocking(S::start_dedicated).await??)
        } else {
            let start = || async {
                TestResult::Ok(Arc::new(
                    tokio::task::spawn_blocking(S::start_shared).await??,
                ))
            };
            Arc::clone(self.shared.get_or_try_init(start).await?)
        };
        let mut url = server.case_url(n);
        if let Some(option) = S::REQUEST_TIMEOUT_OPTION {
            url = with_patient_timeout(url, option);
        }
        Ok(Box::new(UrlStore {
            url,
            server,
            backend: self.backend,
            fence: self.fence,
        }))
    }
}

/// Checks that both entry points refuse each of `urls` with
/// `Error::InvalidUrl` whose message does not contain `secret`.
pub async fn assert_invalid_urls_hide(
    backend: Opener<dyn Backend>,
    fence: Opener<dyn Fence>,
    urls: &[&str],
    secret: &str,
) -> TestResult {
    use fencelock_core::Error;
    for url in urls {
        let results = [
            backend(url.to_string()).await.map(|_| ()),
            fence(url.to_string()).await.map(|_| ()),
        ];
        for result in results {
            match result {
                Err(Error::InvalidUrl(msg)) if !msg.contains(secret) => {}
                other => return Err(format!("{url}: {other:?}").into()),
            }
        }
    }
    Ok(())
}
