//! The conformance harness: one isolated store per case, cases selected by
//! what the backend can do, reported through libtest-mimic so that each case
//! is its own test (`cargo test -p fencelock-sqlite -- i1_` runs a subset).

use std::{process::ExitCode, sync::Arc, time::Duration};

use async_trait::async_trait;
use fencelock_core::{Backend, Fence};
use libtest_mimic::{Arguments, Failed, Trial};

use crate::{
    cases::{Case, CASES},
    patience::Patience,
    proxy::ProxiedUrl,
    report,
};

/// Errors in test plumbing (starting servers, connecting).
pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One isolated lock store, private to one case: a SQLite file, a table on a
/// shared server, a key prefix, or a whole server of its own.
#[async_trait]
pub trait Store: Send + Sync {
    /// A new connection to this store. Backends from one store share locks,
    /// like two processes pointed at the same URL.
    async fn connect(&self) -> TestResult<Arc<dyn Backend>>;

    /// A fence kept in this store, if the backend ships one.
    async fn fence(&self) -> TestResult<Option<Arc<dyn Fence>>> {
        Ok(None)
    }

    /// Stops and restarts the store's server (or closes and reopens the
    /// database file), keeping whatever the backend's durability keeps.
    /// Connections made before may fail for a while afterwards.
    async fn restart(&self) -> TestResult {
        Err("this store cannot be restarted".into())
    }

    /// A new connection to this store that goes through fault proxies of
    /// its own (one per server endpoint), which the caller switches. Only
    /// this connection suffers the faults: other connections, like the
    /// other processes of a partitioned system, reach the server directly.
    async fn connect_via_proxy(&self) -> TestResult<ProxiedBackend> {
        Err("this store has no network to put a proxy in".into())
    }
}

/// A backend connected through a [`ProxiedUrl`], and the proxies' switches.
#[derive(Debug)]
pub struct ProxiedBackend {
    /// The connection; every byte it exchanges with the server passes the
    /// proxies.
    pub backend: Arc<dyn Backend>,
    /// The proxies, healthy to begin with. Dropping them resets the
    /// connection for good.
    pub proxy: ProxiedUrl,
}

/// Makes stores for one backend.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// The backend's name, prefixed to every case name.
    fn name(&self) -> &'static str;

    /// Whether [`Store::restart`] works (cases that need it are ignored
    /// otherwise).
    fn can_restart(&self) -> bool;

    /// Whether [`Store::fence`] returns a fence.
    fn has_fence(&self) -> bool;

    /// Whether [`Store::connect_via_proxy`] works: the backend talks to a
    /// server over TCP (cases that need it are ignored otherwise).
    fn can_proxy(&self) -> bool {
        false
    }

    /// A fresh, empty store for one case. With `dedicated`, the store gets a
    /// server process of its own, so the case may restart it without
    /// disturbing other cases.
    async fn store(&self, dedicated: bool) -> TestResult<Box<dyn Store>>;
}

/// What a case needs from the backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// [`Store::restart`].
    pub restart: bool,
    /// [`Store::fence`].
    pub fence: bool,
    /// [`Store::connect_via_proxy`]: a network between client and server.
    pub network: bool,
}

/// Upper bound on one case, as a base figure of its budget; a case that
/// hangs fails instead of stalling CI.
const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs every conformance case against `factory`, honouring the usual test
/// arguments (filters, `--list`, `--test-threads`). Call it from the `main`
/// of a `harness = false` test binary and return its exit code.
pub fn run(factory: impl StoreFactory) -> ExitCode {
    run_suites([Suite::new(factory)])
}

/// A store factory and the cases to run against it, one of the suites of a
/// conformance binary that covers several layouts of a backend.
pub struct Suite {
    factory: Arc<dyn StoreFactory>,
    group: &'static str,
}

impl Suite {
    /// Every case, against `factory`.
    pub fn new(factory: impl StoreFactory) -> Self {
        Self {
            factory: Arc::new(factory),
            group: "",
        }
    }

    /// Only the cases of one group (`fair`, `exclusion`, …), for a store
    /// whose other cases another suite covers.
    pub fn group(mut self, group: &'static str) -> Self {
        self.group = group;
        self
    }
}

/// [`run`] for several suites in one binary (one link for all the layouts of
/// a backend). Each case's name starts with its factory's name, so the
/// names must differ; a clash is reported as a failure of the binary.
pub fn run_suites(suites: impl IntoIterator<Item = Suite>) -> ExitCode {
    init_tracing();
    let args = Arguments::from_args();
    let mut names = std::collections::BTreeSet::new();
    let mut trials = Vec::new();
    for suite in suites {
        if !names.insert(suite.factory.name()) {
            eprintln!(
                "two conformance suites in this binary are named {:?}; their cases would clash",
                suite.factory.name()
            );
            return ExitCode::FAILURE;
        }
        trials.extend(
            CASES
                .iter()
                .filter(|case| {
                    suite.group.is_empty() || case.name.split("::").next() == Some(suite.group)
                })
                .map(|case| trial(Arc::clone(&suite.factory), case)),
        );
    }
    libtest_mimic::run(&args, trials).exit_code()
}

fn trial(factory: Arc<dyn StoreFactory>, case: &'static Case) -> Trial {
    let name = format!("{}::{}", factory.name(), case.name);
    let unsupported = (case.needs.restart && !factory.can_restart())
        || (case.needs.fence && !factory.has_fence())
        || (case.needs.network && !factory.can_proxy());
    let label = name.clone();
    Trial::test(name, move || run_case(&*factory, case, &label)).with_ignored_flag(unsupported)
}

fn run_case(factory: &dyn StoreFactory, case: &'static Case, name: &str) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let started = std::time::Instant::now();
    let result = report::as_case(name, || {
        runtime.block_on(async {
            // A first look at the machine, before the store exists: the
            // store's own request bounds follow it (`UrlServer`).
            Patience::measure().await;
            let store = factory
                .store(case.needs.restart)
                .await
                .map_err(|e| format!("could not set up a {} store: {e}", factory.name()))?;
            // The case's budget, measured against its own store now: its TTLs
            // and bounds scale with what this machine costs at this moment.
            let probe = store
                .connect()
                .await
                .map_err(|e| format!("could not connect to the {} store: {e}", factory.name()))?;
            let patience = Patience::against(&*probe).await;
            drop(probe);
            let timeout = patience.bound(CASE_TIMEOUT);
            match tokio::time::timeout(timeout, patience.scope((case.run)(&*store))).await {
                Ok(result) => result.map_err(|e| Failed::from(format!("{e} [{patience}]"))),
                Err(_) => Err(Failed::from(format!(
                    "case did not finish within {timeout:?} [{patience}]"
                ))),
            }
        })
    });
    report::finished(name, started.elapsed(), result.is_ok());
    result
}

fn init_tracing() {
    // `RUST_LOG=fencelock=debug cargo test …` shows what the library did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
