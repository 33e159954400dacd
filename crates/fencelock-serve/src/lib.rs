//! `fencelock serve`: any fencelock backend as a lock service over HTTP
//! (`docs/http.md`).
//!
//! The service is a thin REST layer over a [`LockClient`] and a [`Fence`]:
//! every grant, renewal and release is one call of the backend, so leases,
//! tokens and fences keep I1–I7 (`docs/semantics.md`) exactly as in the
//! library. The service holds no lease itself: its HTTP clients renew and
//! release by (owner, token).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
//! use fencelock_serve::{Server, Service};
//!
//! let client = LockClient::new(Arc::new(MemoryBackend::new()));
//! let service = Service::builder(client).fence(Arc::new(MemoryFence::new())).build();
//! let server = Server::bind("127.0.0.1:0".parse().unwrap(), service).await?;
//! println!("listening on {}", server.local_addr());
//! server.run(std::future::pending()).await
//! # }
//! ```

#![forbid(unsafe_code)]

mod activity;
mod api;
mod auth;
mod conns;
mod dashboard;
mod error;
mod events;
mod fair;
mod metrics;
mod server;

use std::{sync::Arc, time::Duration};

use axum::{
    routing::{get, post, put},
    Router,
};
use fencelock_core::{CancellationToken, Fence, LockClient};

pub use auth::{Caller, Role, Tokens};
pub use fencelock_http::wire;
pub use server::{default_max_connections, raise_file_limit, Limits, Server, ServerHandle};

/// How often the event stream lists the backend to see changes made by
/// other clients and expiries, while someone follows it.
const DEFAULT_EVENTS_INTERVAL: Duration = Duration::from_millis(500);

/// The lock service's shared state: what [`router`] serves.
#[derive(Clone, Debug)]
pub struct Service {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: LockClient,
    fence: Option<Arc<dyn Fence>>,
    /// Whether the fence keeps its records in the lock store (`docs/http.md`,
    /// "Threat model"): then a token above the one the store issued last
    /// for a key is refused at the resource of that name.
    fence_shares_store: bool,
    tokens: Option<Tokens>,
    events: events::Events,
    activity: Arc<activity::Activity>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// The kinds with a `fencelock_backend_held` series of their own.
    kinds: metrics::Kinds,
    max_kinds: usize,
    shutdown: CancellationToken,
    /// Each client's share of the backend (`fair.rs`).
    shares: fair::Shares,
}

/// Builds a [`Service`].
#[derive(Debug)]
#[must_use]
pub struct ServiceBuilder {
    client: LockClient,
    fence: Option<Arc<dyn Fence>>,
    fence_shares_store: bool,
    tokens: Option<Tokens>,
    events_interval: Duration,
    events_notices: bool,
    max_kinds: usize,
    client_concurrency: usize,
}

impl ServiceBuilder {
    /// The fence behind `/v1/fences` and the fenced key-value store
    /// (without one, those routes answer 400 `unsupported`).
    pub fn fence(mut self, fence: Arc<dyn Fence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Says that the fence serves the tokens of the client's lock store
    /// (as `fencelock serve` opens both, from one URL), so that admissions
    /// and fenced writes of tokens that store never issued are refused: 0,
    /// above 2^53 − 1, and above the latest token it issued for the key of
    /// the resource's name, learned on a free key by taking it for a
    /// moment (default false: a fence of the embedding program's may be
    /// shown tokens from elsewhere).
    pub fn fence_shares_store(mut self, yes: bool) -> Self {
        self.fence_shares_store = yes;
        self
    }

    /// Requires a bearer token from `tokens` on every route but `/healthz`.
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// How often `/v1/events` lists the backend for changes made by other
    /// clients and for expiries (default 500 ms), while someone follows it.
    pub fn events_interval(mut self, interval: Duration) -> Self {
        self.events_interval = interval;
        self
    }

    /// Whether `/v1/events` follows the backend's change notices where it
    /// has them (default true; PostgreSQL, Redis), listing it whole only
    /// every 30 s, or every `events_interval` if longer (`docs/http.md`); false
    /// lists every `events_interval` whatever the backend, which is only
    /// worth it to compare the two (`docs/benchmarks.md`).
    pub fn events_notices(mut self, yes: bool) -> Self {
        self.events_notices = yes;
        self
    }

    /// How many lease kinds get a `fencelock_backend_held` series of their
    /// own on `/metrics` (default 100); leases of other kinds are counted
    /// under `kind="other"`, so that no client can add series at will
    /// (`docs/observability.md`).
    pub fn max_kinds(mut self, max: usize) -> Self {
        self.max_kinds = max;
        self
    }

    /// How many backend operations each client token may have in flight at
    /// once, in each of two lanes: renewals, and every other call (default
    /// 16, at least 1). Its further requests wait for their turn, so that
    /// another client's call waits for at most this many of them however
    /// many it sends (`docs/http.md`, "Threat model"). The admin token
    /// takes no turns.
    pub fn client_concurrency(mut self, per_client: usize) -> Self {
        self.client_concurrency = per_client;
        self
    }

    /// The service. Installs the Prometheus recorder of `/metrics` as the
    /// process's `metrics` recorder unless one is installed already, and
    /// starts the event poller (it stops with [`Service::shutdown`]); call
    /// it inside a tokio runtime.
    pub fn build(self) -> Service {
        let shutdown = CancellationToken::new();
        let activity = Arc::new(activity::Activity::default());
        let events = events::Events::new(Arc::clone(&activity));
        let service = Service {
            inner: Arc::new(Inner {
                client: self.client,
                fence: self.fence,
                fence_shares_store: self.fence_shares_store,
                tokens: self.tokens,
                events,
                activity,
                metrics: metrics::handle(),
                kinds: metrics::Kinds::default(),
                max_kinds: self.max_kinds,
                shutdown,
                shares: fair::Shares::new(self.client_concurrency),
            }),
        };
        events::spawn_poller(&service, self.events_interval, self.events_notices);
        service
    }
}

impl Service {
    /// A service over `client`'s backend, without fence or tokens.
    pub fn builder(client: LockClient) -> ServiceBuilder {
        ServiceBuilder {
            client,
            fence: None,
            fence_shares_store: false,
            tokens: None,
            events_interval: DEFAULT_EVENTS_INTERVAL,
            events_notices: true,
            max_kinds: metrics::DEFAULT_MAX_KINDS,
            client_concurrency: fair::DEFAULT_CLIENT_CONCURRENCY,
        }
    }

    /// Ends the event streams and the event poller, so that a graceful
    /// shutdown does not wait for clients that follow `/v1/events`.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

/// The service's routes (`docs/http.md`). Every route but `/healthz` needs
/// a bearer token when the service has [`Tokens`].
pub fn router(service: Service) -> Router {
    // Routes that reach the backend once or a few times take their
    // caller's turns (`fair.rs`); a single-key acquisition takes one for its
    // first try itself, and multi-key ones have a share of their own.
    let calls = Router::new()
        .route("/v1/locks", get(api::list))
        .route(
            "/v1/locks/{key}",
            get(api::inspect).delete(api::force_release),
        )
        .route("/v1/locks/{key}/release", post(api::release))
        .route("/v1/locks/{key}/data", put(api::set_data))
        .route("/v1/locks/{key}/intent", post(api::post_intent))
        .route(
            "/v1/locks/{key}/intent/withdraw",
            post(api::withdraw_intent),
        )
        .route("/v1/locks/{key}/queue", get(api::queue))
        .route("/v1/locks/{key}/queue/leave", post(api::leave_queue))
        .route("/v1/owners/{owner}/release", post(api::release_all))
        .route("/v1/stats", get(api::stats))
        .route("/v1/cleanup", post(api::cleanup))
        .route("/v1/activity", get(activity::activity))
        .route(
            "/v1/fences/{resource}",
            get(api::fence_current).delete(api::reset_fence),
        )
        .route("/v1/fences/{resource}/admit", post(api::admit))
        .route(
            "/v1/kv/{key}",
            put(api::kv_put).get(api::kv_get).delete(api::reset_fence),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (service.clone(), fair::Lane::Calls),
            fair::take_turn,
        ));
    let renewals = Router::new()
        .route("/v1/renew", post(api::renew_many))
        .route("/v1/locks/{key}/renew", post(api::renew))
        .route_layer(axum::middleware::from_fn_with_state(
            (service.clone(), fair::Lane::Renewals),
            fair::take_turn,
        ));
    let v1 = Router::new()
        .route("/v1/info", get(api::info))
        .route("/v1/acquire", post(api::acquire_all))
        .route("/v1/locks/{key}/acquire", post(api::acquire))
        .route("/v1/events", get(events::stream))
        .route("/metrics", get(metrics::scrape))
        .merge(calls)
        .merge(renewals)
        .route_layer(axum::middleware::from_fn_with_state(
            service.clone(),
            auth::require,
        ));
    // The dashboard's page merges its routes here: `.merge(dashboard::routes())`.
    Router::new()
        .route("/healthz", get(api::healthz))
        .merge(v1)
        .merge(dashboard::routes())
        .fallback(api::not_found)
        .with_state(service)
}
