//! The backend, fence and driver that speak to a `fencelock serve` service.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use fencelock_core::{
    parse_duration, redact_url, Acquire, AcquireAll, AcquireRequest, Admission, Backend,
    BackendError, Capabilities, Driver, Error, ErrorStatus, FairQueue, Fence, FencedValue,
    FencingToken, Grant, HolderChange, LeaseId, LockInfo, LockKey, LockMode, Owner, Renewal,
    Result, WakeSubscription, Watch, WatchFeeder, WriteIntents,
};
use futures_util::{FutureExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde::{de::DeserializeOwned, Serialize};
use url::Url;

use crate::{
    replicas::{Replica, Replicas, Resend, Sent},
    wire::{
        AcquireAllBody, AcquireAllGrant, AcquireBody, AdmitBody, DataBody, ErrorBody, EventBody,
        FenceBody, GrantBody, InfoBody, KvBody, KvPutBody, LockBody, ReleaseBody, RenewBody,
        RenewItem, RenewManyBody, RenewManyResults, ResetBody, MAX_RENEW_BATCH,
    },
};

mod admin;
mod queue;
mod shared;

const NAME: &str = "http";
/// Bound on connecting to the service.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle connection is kept for reuse: less than the service's
/// default idle timeout (60 s, `docs/http.md`), so that the client drops
/// it before the service closes it under a request just sent.
const POOL_IDLE: Duration = Duration::from_secs(50);
/// Backstop on one request; the client bounds its calls more tightly.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a replica may be silent before a request moves on from it
/// (`replica_timeout`): far above a healthy replica's answer (about a
/// millisecond), far below a lease.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(1);
/// The environment variable read for a bearer token when the URL has none.
pub const TOKEN_ENV: &str = "FENCELOCK_HTTP_TOKEN";

/// `http://` and `https://`: a lock service started with `fencelock serve`.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpDriver;

#[async_trait]
impl Driver for HttpDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["http", "https"]
    }

    async fn open_backend(&self, url: &str) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(HttpBackend::connect(url).await?))
    }

    async fn open_fence(&self, url: &str) -> Result<Arc<dyn Fence>> {
        Ok(Arc::new(HttpFence {
            conn: Connection::new(url)?,
        }))
    }
}

/// How requests reach the service: the base URL of each replica, the bearer
/// token and one pooled HTTP client.
///
/// With several replicas (`http://h1:7878,h2:7878/`), requests go to one of
/// them until it fails: a refused connection moves to the next one and
/// tries again at once (the request never reached anyone, so nothing can
/// have happened twice); any other failure moves on for the next request
/// only, because the failed one may have taken effect. A replica that
/// accepts and does not answer is left behind as [`crate::replicas`] says.
#[derive(Clone)]
struct Connection {
    /// The first replica's base URL; requests are built on it and sent to
    /// the chosen replica's host and port (every replica has this path).
    base: Url,
    replicas: Arc<Replicas>,
    token: Option<String>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("base", &self.base.as_str())
            .field("replicas", &self.replicas.len())
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Connection {
    /// Parses
    /// `http[s]://[:TOKEN@]host:port[,host:port…][/prefix][?token_file=PATH][&ca_file=PATH][&replica_timeout=DURATION]`.
    fn new(url: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidUrl(format!("{}: {why}", redact_url(url)));
        let (first, others) = split_hosts(url);
        let mut base = Url::parse(&first).map_err(|e| bad(e.to_string()))?;
        let mut replicas = vec![Replica::new(
            base.host_str().unwrap_or_default().to_owned(),
            base.port(),
        )];
        for other in others {
            let mut replica = base.clone();
            let (host, port) = match other.rsplit_once(':') {
                Some((host, port)) if !port.contains(']') => (
                    host,
                    Some(
                        port.parse::<u16>()
                            .map_err(|_| bad(format!("{other:?} is not host:port")))?,
                    ),
                ),
                _ => (other.as_str(), None),
            };
            if host.is_empty() {
                return Err(bad("an empty host in the list of replicas".to_owned()));
            }
            replica
                .set_host(Some(host))
                .map_err(|e| bad(format!("{other:?}: {e}")))?;
            replicas.push(Replica::new(
                replica.host_str().unwrap_or_default().to_owned(),
                port.or(base.port()),
            ));
        }
        if base.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host".to_owned()));
        }
        let mut token = base.password().map(percent_decode);
        if token.is_some() {
            // Said once per connection, never with the token: a password
            // in a URL is in `ps` output and shell history for anyone on
            // the host to read.
            tracing::warn!(
                "the lock service token is in the URL, where `ps` and shell history show it; \
                 prefer {TOKEN_ENV} or ?token_file=PATH"
            );
        }
        // No overall time-out on the client: the event stream of `subscribe`
        // lasts as long as its waiter; `call` bounds every other request.
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE);
        let mut patience = REPLICA_TIMEOUT;
        for (name, value) in base.query_pairs() {
            match name.as_ref() {
                "token_file" => {
                    let text = std::fs::read_to_string(value.as_ref())
                        .map_err(|e| bad(format!("cannot read token_file {value}: {e}")))?;
                    token = Some(text.trim().to_owned());
                }
                "ca_file" => {
                    // A private CA, as internal services usually have.
                    let pem = std::fs::read(value.as_ref())
                        .map_err(|e| bad(format!("cannot read ca_file {value}: {e}")))?;
                    let certs = reqwest::Certificate::from_pem_bundle(&pem)
                        .map_err(|e| bad(format!("ca_file {value}: {e}")))?;
                    for cert in certs {
                        http = http.add_root_certificate(cert);
                    }
                }
                "replica_timeout" => {
                    patience = parse_duration(&value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            bad(format!(
                                "replica_timeout={value:?} is not a duration above zero (e.g. 1s, 500ms)"
                            ))
                        })?;
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {other:?}; known: token_file, ca_file, replica_timeout"
                    )))
                }
            }
        }
        if token.is_none() {
            token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
        }
        let _ = base.set_password(None);
        let _ = base.set_username("");
        base.set_query(None);
        base.set_fragment(None);
        if base.path_segments().is_none() {
            return Err(bad("not a base URL".to_owned()));
        }
        let http = http
            .build()
            .map_err(|e| BackendError::permanent(NAME, "cannot build the HTTP client", e))?;
        Ok(Self {
            base,
            replicas: Arc::new(Replicas::new(replicas, patience)),
            token,
            http,
        })
    }

    /// `url` at replica `at`.
    fn at_replica(&self, url: &Url, at: usize) -> Url {
        let mut target = url.clone();
        if self.replicas.len() > 1 {
            let replica = self.replicas.get(at);
            // Both were accepted by the URL parser when the connection was
            // made, on a URL of this very scheme.
            let _ = target.set_host(Some(&replica.host));
            let _ = target.set_port(replica.port);
        }
        target
    }

    /// How long a request that may be sent twice waits for a replica
    /// before it is sent to another as well.
    fn resend_after(&self) -> Resend {
        Resend::After(self.replicas.patience)
    }

    /// Sends the request `make` builds for `url` to a replica, failing over
    /// as the type's comment says.
    async fn send(
        &self,
        url: Url,
        resend: Resend,
        make: impl Fn(Url) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let attempt = |at| make(self.at_replica(&url, at)).send().boxed();
        // Anything the replica answers, even a refusal, proves it alive.
        let probe = {
            let conn = self.clone();
            move |at| {
                let conn = conn.clone();
                async move {
                    let url = conn.at_replica(&conn.url(&["v1", "info"]), at);
                    conn.request(Method::GET, url).send().await.is_ok()
                }
                .boxed()
            }
        };
        match self
            .replicas
            .send(resend, attempt, probe, reqwest::Error::is_connect, |r| {
                // "Not held" and "not found": what a resent renewal or
                // release answers after an earlier copy took effect.
                matches!(r.status(), StatusCode::CONFLICT | StatusCode::NOT_FOUND)
            })
            .await
        {
            Sent::Answer(response) => Ok(response),
            Sent::Failed(e) => Err(transport(e)),
            Sent::Silent => Err(BackendError::message(
                NAME,
                ErrorStatus::Timeout,
                format!(
                    "no replica of the lock service answered within replica_timeout ({:?})",
                    self.replicas.patience
                ),
            )
            .into()),
        }
    }

    /// The URL of `segments` under the base, each percent-encoded (a key
    /// may contain `/`).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends a request and returns the status and the body's bytes. Every
    /// failure is classified here, once.
    async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Duration,
        resend: Resend,
    ) -> Result<(StatusCode, Vec<u8>)> {
        let response = self
            .send(url, resend, |url| {
                let request = self.request(method.clone(), url).timeout(timeout);
                match body {
                    Some(body) => request.json(body),
                    None => request,
                }
            })
            .await?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        Ok((status, bytes.to_vec()))
    }

    /// A call whose only success is 200 with a `T` body; `expected` lists
    /// the refusal codes the caller handles (returned as `Err(Ok(body))`).
    /// A read may be sent twice; anything else is sent once per replica.
    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + Sync)>,
        expected: &[StatusCode],
    ) -> Result<std::result::Result<T, ErrorBody>> {
        let resend = if method == Method::GET {
            self.resend_after()
        } else {
            Resend::Never
        };
        self.json_within(method, url, body, expected, REQUEST_TIMEOUT, resend)
            .await
    }

    /// [`Connection::json`] bounded by `timeout` (a long poll's wait and
    /// then the usual bound), sent again elsewhere as `resend` allows.
    async fn json_within<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + Sync)>,
        expected: &[StatusCode],
        timeout: Duration,
        resend: Resend,
    ) -> Result<std::result::Result<T, ErrorBody>> {
        // A read changes nothing, so a read that failed in transit (a
        // replica that died under it, a balancer's 502) is tried once more,
        // on the next replica when there are several.
        let tries = if method == Method::GET { 2 } else { 1 };
        let mut answer = self
            .answer(method.clone(), url.clone(), body, expected, timeout, resend)
            .await;
        for _ in 1..tries {
            match &answer {
                Err(e) if e.is_transient() => {
                    answer = self
                        .answer(method.clone(), url.clone(), body, expected, timeout, resend)
                        .await;
                }
                _ => break,
            }
        }
        answer
    }

    /// One try of [`Connection::json`].
    async fn answer<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + Sync)>,
        expected: &[StatusCode],
        timeout: Duration,
        resend: Resend,
    ) -> Result<std::result::Result<T, ErrorBody>> {
        let (status, bytes) = self.call(method, url, body, timeout, resend).await?;
        if status == StatusCode::OK {
            return serde_json::from_slice(&bytes).map(Ok).map_err(|e| {
                // A 200 whose body does not parse was cut or garbled: what
                // the service did is unknown, never a success.
                Error::from(BackendError::timeout(
                    NAME,
                    format!("unreadable answer from the lock service: {e}"),
                ))
            });
        }
        let refusal = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or_else(|_| ErrorBody {
            error: String::from_utf8_lossy(&bytes).chars().take(200).collect(),
            code: String::new(),
            holder: None,
            current: None,
        });
        if expected.contains(&status) {
            return Ok(Err(refusal));
        }
        Err(refused(status, refusal))
    }
}

/// Splits `scheme://[userinfo@]h1:p1,h2:p2/rest` into the URL of the first
/// host (`scheme://[userinfo@]h1:p1/rest`) and the other `host:port`s.
fn split_hosts(url: &str) -> (String, Vec<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), Vec::new());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let mut hosts = hosts.split(',');
    let first = hosts.next().unwrap_or_default();
    (
        format!("{scheme}://{userinfo}{first}{tail}"),
        hosts.map(str::to_owned).collect(),
    )
}

/// The userinfo password is percent-encoded in a URL.
fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("t={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map_or_else(|| s.to_owned(), |(_, v)| v.into_owned())
}

/// A request that got no (complete) answer. Only a refused connection
/// proves that the service did nothing; anything else may have taken effect.
fn transport(e: reqwest::Error) -> Error {
    let message = "the lock service did not answer";
    // reqwest's own message names only the URL; its causes say what failed
    // (a certificate refused, and why; a reset; a refused connection).
    let mut causes = String::new();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        causes.push_str(if causes.is_empty() { " (" } else { ": " });
        causes.push_str(&c.to_string());
        cause = c.source();
    }
    if !causes.is_empty() {
        causes.push(')');
    }
    if e.is_connect() {
        BackendError::transient(
            NAME,
            format!("cannot connect to the lock service{causes}"),
            e,
        )
        .into()
    } else {
        BackendError::message(
            NAME,
            ErrorStatus::Timeout,
            format!("{message}: {e}{causes}"),
        )
        .into()
    }
}

/// A refusal the caller did not expect, as the error the service meant.
fn refused(status: StatusCode, body: ErrorBody) -> Error {
    let message = body.error;
    match body.code.as_str() {
        "invalid_key" => return Error::InvalidKey(message),
        "invalid_owner" => return Error::InvalidOwner(message),
        "invalid_ttl" => return Error::InvalidTtl(message),
        "invalid_token" => return Error::InvalidToken(message),
        "unsupported" => return Error::Unsupported(message),
        "bad_request" | "value_too_large" => return Error::InvalidArgument(message),
        _ => {}
    }
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // A missing or unknown token (401), or a client token on an admin
        // route (403): the same token is refused again. The status stays
        // in the message: it is what an operator searches the service's
        // logs and docs for.
        let context = if status == StatusCode::FORBIDDEN {
            format!("the lock service refused this token the operation ({status})")
        } else {
            format!("the lock service refused the token ({status})")
        };
        return BackendError::unauthorized(NAME, context, message).into();
    }
    let message = format!("{status}: {message}");
    let status = match status {
        StatusCode::GATEWAY_TIMEOUT => ErrorStatus::Timeout,
        StatusCode::SERVICE_UNAVAILABLE if body.code == "timeout" => ErrorStatus::Timeout,
        StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::BAD_GATEWAY
        | StatusCode::TOO_MANY_REQUESTS => ErrorStatus::Transient,
        _ => ErrorStatus::Permanent,
    };
    BackendError::message(NAME, status, message).into()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A grant as the service reported it. Only the granted length matters to
/// the guard: its deadline is counted from before the request was sent
/// (I5), never from this answer's `expires_at`.
fn grant(body: GrantBody) -> Grant {
    Grant::new(
        FencingToken(body.token),
        Duration::from_millis(body.ttl_ms),
        body.expires_at,
    )
}

/// Locks through a `fencelock serve` service.
///
/// Each operation is one request; the service makes one backend call of
/// it, so this backend keeps what the service's backend keeps. A wait is a
/// series of long polls the service answers on its backend's own wake-up
/// ([`Backend::try_acquire_waiting`]); on a fair backend the wait keeps its
/// queue entry with single tries instead, woken by the service's event
/// stream (`GET /v1/events?key=`, `docs/http.md`).
#[derive(Clone, Debug)]
pub struct HttpBackend {
    conn: Connection,
    capabilities: Capabilities,
}

impl HttpBackend {
    /// One acquisition, of the writer's side or a reader's as the request
    /// says, waiting up to `wait` in the service (a long poll) when not
    /// zero.
    async fn acquire_as(&self, request: &AcquireRequest, wait: Duration) -> Result<Acquire> {
        let mode = self.wire_mode(request.mode)?;
        let body = AcquireBody {
            owner: Some(request.owner.to_string()),
            ttl_ms: millis(request.ttl),
            // Rounded up: the client asks again at once only after a
            // stretch waited whole.
            wait_ms: (!wait.is_zero()).then(|| millis(wait + Duration::from_nanos(999_999))),
            kind: request.kind.clone(),
            data: request.data.clone(),
            mode,
            min_token: request.min_token.map(FencingToken::get),
            queue: request.queue,
        };
        let url = self.lock_url(&request.key, Some("acquire"));
        match self
            .conn
            .json_within::<GrantBody>(
                Method::POST,
                url,
                Some(&body),
                &[StatusCode::CONFLICT],
                REQUEST_TIMEOUT + wait,
                Resend::Never,
            )
            .await?
        {
            Ok(g) => Ok(Acquire::Granted(grant(g))),
            Err(refusal) if refusal.code == "held" => Ok(Acquire::Held(refusal.holder)),
            Err(refusal) if refusal.code == "tokens_exhausted" => Err(Error::TokensExhausted {
                key: request.key.clone(),
            }),
            Err(refusal) => Err(refused(StatusCode::CONFLICT, refusal)),
        }
    }

    async fn renew_as(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let mode = self.wire_mode(lease.mode)?;
        let body = RenewBody {
            owner: lease.owner.to_string(),
            token: lease.token.get(),
            ttl_ms: Some(millis(ttl)),
            mode,
        };
        let url = self.lock_url(&lease.key, Some("renew"));
        match self
            .conn
            .json_within::<GrantBody>(
                Method::POST,
                url,
                Some(&body),
                &[StatusCode::CONFLICT],
                REQUEST_TIMEOUT,
                self.renewal_resend([ttl]),
            )
            .await?
        {
            Ok(g) => Ok(grant(g)),
            Err(_) => Err(Error::not_held(lease)),
        }
    }

    async fn release_as(&self, lease: &LeaseId) -> Result<()> {
        let mode = self.wire_mode(lease.mode)?;
        let body = ReleaseBody {
            owner: lease.owner.to_string(),
            token: lease.token.get(),
            mode,
        };
        let url = self.lock_url(&lease.key, Some("release"));
        // Releasing twice is releasing once: the second finds the lease gone.
        match self
            .conn
            .json_within::<serde_json::Value>(
                Method::POST,
                url,
                Some(&body),
                &[StatusCode::CONFLICT],
                REQUEST_TIMEOUT,
                self.conn.resend_after(),
            )
            .await?
        {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::not_held(lease)),
        }
    }

    /// Renewing twice is renewing once, so a renewal is sent to another
    /// replica when its own has not answered within a sixth of the shortest
    /// lease: half of the third of a lease the renewer gives each attempt,
    /// which leaves the copy the other half (`docs/http.md`, "Several
    /// replicas").
    fn renewal_resend(&self, ttls: impl IntoIterator<Item = Duration>) -> Resend {
        let shortest = ttls.into_iter().min().unwrap_or(Duration::MAX);
        Resend::After(self.conn.replicas.patience.min(shortest / 6))
    }

    /// A request whose answer carries nothing but success.
    async fn call_ok(
        &self,
        method: Method,
        url: Url,
        body: &(impl Serialize + Sync),
    ) -> Result<()> {
        self.conn
            .json::<serde_json::Value>(method, url, Some(body), &[])
            .await?
            .map(|_| ())
            .map_err(|e| refused(StatusCode::OK, e))
    }

    /// Refuses what only a service over a backend with read-write locks does.
    fn shared_only(&self, what: &str) -> Result<()> {
        if self.capabilities.shared {
            Ok(())
        } else {
            Err(Error::unsupported(NAME, what))
        }
    }

    /// The wire's `mode` field: absent for the writer's side, as from a
    /// client that predates read-write locks; a reader's only to a service
    /// that has them.
    fn wire_mode(&self, mode: LockMode) -> Result<Option<LockMode>> {
        match mode {
            LockMode::Exclusive => Ok(None),
            LockMode::Shared => self.shared_only("shared locks").map(|()| Some(mode)),
        }
    }

    /// Connects to the service `url` names and learns what its backend can
    /// do (`GET /v1/info`).
    pub async fn connect(url: &str) -> Result<Self> {
        let conn = Connection::new(url)?;
        let info: InfoBody = conn
            .json(Method::GET, conn.url(&["v1", "info"]), None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        let remote = info.capabilities;
        let capabilities = Capabilities::default()
            .with_wakeups(true)
            // Every service streams each key's events, whatever its backend.
            .with_watch(true)
            .with_persistent(remote.persistent)
            .with_keeps_expired(remote.keeps_expired)
            .with_min_token(remote.min_token)
            .with_set_data(remote.set_data)
            .with_shared(remote.shared)
            // One request for a client's due renewals, whatever the backend
            // does with them behind the service.
            .with_batch_renew(info.renew_batch)
            .with_atomic_multi(remote.atomic_multi && info.renew_batch)
            // Queue entries are the backend's own; the service passes the
            // attempts that keep them (`docs/fairness.md`).
            .with_fair(remote.fair)
            // Every service long-polls an acquisition (`wait_ms`), woken
            // by its own backend.
            .with_waits(true);
        Ok(Self { conn, capabilities })
    }

    /// `POST /v1/renew` in chunks of at most [`MAX_RENEW_BATCH`]; falls back
    /// to one request per lease on a service without the route.
    async fn renew_batch(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        if !self.capabilities.batch_renew {
            let mut results = Vec::with_capacity(renewals.len());
            for r in renewals {
                results.push(self.renew_as(&r.lease, r.ttl).await);
            }
            return Ok(results);
        }
        let url = self.conn.url(&["v1", "renew"]);
        let mut results = Vec::with_capacity(renewals.len());
        for chunk in renewals.chunks(MAX_RENEW_BATCH) {
            let body = RenewManyBody {
                leases: chunk
                    .iter()
                    .map(|r| {
                        Ok(RenewItem {
                            key: r.lease.key.to_string(),
                            owner: r.lease.owner.to_string(),
                            token: r.lease.token.get(),
                            ttl_ms: Some(millis(r.ttl)),
                            mode: self.wire_mode(r.lease.mode)?,
                        })
                    })
                    .collect::<Result<_>>()?,
            };
            let answer: RenewManyResults = self
                .conn
                .json_within(
                    Method::POST,
                    url.clone(),
                    Some(&body),
                    &[],
                    REQUEST_TIMEOUT,
                    self.renewal_resend(chunk.iter().map(|r| r.ttl)),
                )
                .await?
                .map_err(|e| refused(StatusCode::OK, e))?;
            if answer.results.len() != chunk.len() {
                // Which result belongs to which lease is unknown: nothing
                // is known of any of them.
                return Err(BackendError::timeout(
                    NAME,
                    format!(
                        "the lock service answered {} results for {} renewals",
                        answer.results.len(),
                        chunk.len()
                    ),
                )
                .into());
            }
            for (r, result) in chunk.iter().zip(answer.results) {
                results.push(match (result.status, result.grant, result.error) {
                    (200, Some(g), _) => Ok(grant(g)),
                    (409, _, _) => Err(Error::not_held(&r.lease)),
                    (status, _, error) => Err(refused(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                        error.unwrap_or_else(|| ErrorBody {
                            error: "no outcome for this renewal".to_owned(),
                            code: String::new(),
                            holder: None,
                            current: None,
                        }),
                    )),
                });
            }
        }
        Ok(results)
    }

    fn lock_url(&self, key: &LockKey, action: Option<&str>) -> Url {
        match action {
            Some(a) => self.conn.url(&["v1", "locks", key.as_str(), a]),
            None => self.conn.url(&["v1", "locks", key.as_str()]),
        }
    }
}

#[async_trait]
impl Backend for HttpBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.acquire_as(request, Duration::ZERO).await
    }

    /// A long poll: the service waits up to `wait` with its backend's own
    /// wake-ups and answers the grant at once.
    async fn try_acquire_waiting(
        &self,
        request: &AcquireRequest,
        wait: Duration,
    ) -> Result<Acquire> {
        self.acquire_as(request, wait).await
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        self.renew_as(lease, ttl).await
    }

    /// `POST /v1/acquire`, one attempt: the service takes the keys in its
    /// backend's atomic step. It takes one owner, TTL, kind and data for
    /// every key (and a floor per key); other sets are taken one by one.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let Some(first) = requests.first() else {
            return Err(Error::InvalidArgument(
                "lock_all needs at least one key".into(),
            ));
        };
        let uniform = requests.iter().all(|r| {
            r.owner == first.owner
                && r.ttl == first.ttl
                && r.kind == first.kind
                && r.data == first.data
        });
        if !uniform || !self.capabilities.atomic_multi {
            return Err(Error::unsupported(
                NAME,
                "atomic multi-key acquisition of this set",
            ));
        }
        let body = AcquireAllBody {
            keys: requests.iter().map(|r| r.key.to_string()).collect(),
            owner: Some(first.owner.to_string()),
            ttl_ms: millis(first.ttl),
            wait_ms: None,
            kind: first.kind.clone(),
            data: first.data.clone(),
            min_tokens: requests
                .iter()
                .filter_map(|r| Some((r.key.to_string(), r.min_token?.get())))
                .collect(),
        };
        let url = self.conn.url(&["v1", "acquire"]);
        match self
            .conn
            .json::<AcquireAllGrant>(Method::POST, url, Some(&body), &[StatusCode::CONFLICT])
            .await?
        {
            Ok(answer) => {
                let mut grants = Vec::with_capacity(requests.len());
                for r in requests {
                    let Some(g) = answer.grants.iter().find(|g| g.key == r.key.as_str()) else {
                        // Granted, but not as asked: nothing is known of
                        // the keys, which expire if they were taken.
                        return Err(BackendError::timeout(
                            NAME,
                            format!("the lock service's grant lacks key {}", r.key),
                        )
                        .into());
                    };
                    grants.push(grant(g.clone()));
                }
                Ok(AcquireAll::Granted(grants))
            }
            Err(refusal) if refusal.code == "held" => {
                let index = refusal
                    .holder
                    .as_ref()
                    .and_then(|h| requests.iter().position(|r| r.key == h.key))
                    .unwrap_or(0);
                Ok(AcquireAll::Held {
                    index,
                    holder: refusal.holder,
                })
            }
            Err(refusal) => Err(refused(StatusCode::CONFLICT, refusal)),
        }
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        self.renew_batch(renewals).await
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.release_as(lease).await
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        if !self.capabilities.set_data {
            return Err(Error::unsupported(NAME, "set_data"));
        }
        let body = DataBody {
            owner: lease.owner.to_string(),
            token: lease.token.get(),
            data,
        };
        let url = self.lock_url(&lease.key, Some("data"));
        match self
            .conn
            .json::<serde_json::Value>(Method::PUT, url, Some(&body), &[StatusCode::CONFLICT])
            .await?
        {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::not_held(lease)),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let url = self.lock_url(key, None);
        Ok(self
            .conn
            .json::<LockBody>(Method::GET, url, None::<&()>, &[StatusCode::NOT_FOUND])
            .await?
            .ok()
            .map(|l| l.info))
    }

    /// Follows `GET /v1/events?key=KEY`: every release, expiry or loss of
    /// the key is a wake-up. The service subscribes before it answers, so
    /// once this returns no later release is missed.
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        let wakeups = self
            .conn
            .follow(key, None)
            .await?
            // A broken stream ends the subscription: the waiter backs off.
            .take_while(|e| std::future::ready(e.is_ok()))
            .filter_map(|e| {
                let wake = e.is_ok_and(|e| {
                    matches!(e.event.as_str(), "released" | "expired" | "lost" | "resync")
                });
                std::future::ready(wake.then_some(()))
            });
        Ok(Some(WakeSubscription::from_stream(wakeups)))
    }

    /// The key's events (`GET /v1/events?key=KEY`) as holder changes, so
    /// that observers are told of every grant the service sees rather than
    /// polling. The stream is followed again after a break, from the last
    /// event's id; when the service cannot replay what was missed (it sent
    /// `resync`), the key is read and the difference reported, a vanished
    /// lease as an expiry (the safe side: an expiry is never reported as a
    /// release).
    async fn watch(&self, key: &LockKey) -> Result<Watch> {
        let events = self.conn.follow(key, None).await?;
        let current = self.inspect(key).await?;
        let (feeder, watch) = Watch::channel();
        tokio::spawn(feed_watch(
            self.clone(),
            key.clone(),
            events,
            current,
            feeder,
        ));
        Ok(watch)
    }

    fencelock_core::offers!(admin);

    // What the service's backend offers, as its `/v1/info` said.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.capabilities.fair.then_some(self as &dyn FairQueue)
    }

    fn write_intents(&self) -> Option<&dyn WriteIntents> {
        self.capabilities
            .shared
            .then_some(self as &dyn WriteIntents)
    }
}

/// A key's event stream, as `Connection::follow` answers it.
type Events = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = std::result::Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// Feeds `feeder` from the key's events until the watch is dropped.
async fn feed_watch(
    backend: HttpBackend,
    key: LockKey,
    mut events: Events,
    current: Option<LockInfo>,
    feeder: WatchFeeder,
) {
    let mut seen = Holders::new(current.as_ref());
    let mut last_id = String::new();
    let mut backoff =
        fencelock_core::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let next = tokio::select! {
            biased;
            _ = feeder.closed() => return,
            next = events.next() => next,
        };
        let changes = match next {
            Some(Ok(event)) => {
                backoff.reset();
                if !event.id.is_empty() {
                    last_id.clone_from(&event.id);
                }
                if event.event == "resync" {
                    match backend.inspect(&key).await {
                        Ok(current) => seen.resync(current),
                        // The stream is followed again below, which asks
                        // for the same again.
                        Err(_) => Vec::new(),
                    }
                } else {
                    match serde_json::from_str::<EventBody>(&event.data) {
                        // Every `acquired` event carries the lease; a
                        // service older than that named its own grants
                        // without it: read it then.
                        Ok(body) if body.kind == "acquired" && body.lock.is_none() => {
                            match backend.inspect(&key).await {
                                Ok(Some(info)) if info.token.get() == body.token => {
                                    seen.acquired(info).into_iter().collect()
                                }
                                // Already over (its end is a later event) or
                                // unreadable now: reported when it ends.
                                _ => Vec::new(),
                            }
                        }
                        Ok(body) => seen.event(&key, body),
                        Err(_) => Vec::new(),
                    }
                }
            }
            Some(Err(_)) | None => {
                tokio::select! {
                    _ = feeder.closed() => return,
                    () = tokio::time::sleep(backoff.next_retry()) => {}
                }
                let from = (!last_id.is_empty()).then_some(last_id.as_str());
                match backend.conn.follow(&key, from).await {
                    Ok(again) => events = again,
                    Err(e) if e.is_transient() => {
                        tracing::debug!(key = %key, error = %e, "watch: following events again failed; retrying");
                    }
                    Err(e) => {
                        let _ = feeder.send(Err(e)).await;
                        return;
                    }
                }
                Vec::new()
            }
        };
        for change in changes {
            if !feeder.send(Ok(change)).await {
                return;
            }
        }
    }
}

/// What a watch fed from events has reported: the holder it last reported
/// acquiring, and the highest token whose end it reported, so that an end
/// seen twice (a `lost` refusal and the listing's `expired`, say) or a grant
/// replayed after a reconnection is reported once.
struct Holders {
    holder: Option<LeaseId>,
    acquired_up_to: u64,
    ended_up_to: u64,
}

impl Holders {
    fn new(current: Option<&LockInfo>) -> Self {
        let token = current.map_or(0, |i| i.token.get());
        Self {
            holder: current.map(|i| LeaseId::new(i.key.clone(), i.owner.clone(), i.token)),
            acquired_up_to: token,
            ended_up_to: 0,
        }
    }

    fn acquired(&mut self, info: LockInfo) -> Option<HolderChange> {
        if info.token.get() <= self.acquired_up_to {
            return None;
        }
        self.acquired_up_to = info.token.get();
        self.holder = Some(LeaseId::new(
            info.key.clone(),
            info.owner.clone(),
            info.token,
        ));
        Some(HolderChange::Acquired(info))
    }

    fn ended(&mut self, lease: LeaseId, expired: bool) -> Option<HolderChange> {
        if lease.token.get() <= self.ended_up_to {
            return None;
        }
        self.ended_up_to = lease.token.get();
        if self.holder.as_ref().is_some_and(|h| h.token == lease.token) {
            self.holder = None;
        }
        Some(if expired {
            HolderChange::Expired(lease)
        } else {
            HolderChange::Released(lease)
        })
    }

    fn event(&mut self, key: &LockKey, body: EventBody) -> Vec<HolderChange> {
        let lease = |owner: Option<String>| {
            let owner = Owner::new(owner?).ok()?;
            Some(LeaseId::new(key.clone(), owner, FencingToken(body.token)))
        };
        let change = match body.kind.as_str() {
            "acquired" => body.lock.and_then(|l| self.acquired(l.info)),
            "released" | "lost" => lease(body.owner).and_then(|l| self.ended(l, false)),
            "expired" => lease(body.owner).and_then(|l| self.ended(l, true)),
            _ => None,
        };
        change.into_iter().collect()
    }

    fn resync(&mut self, current: Option<LockInfo>) -> Vec<HolderChange> {
        let mut changes = Vec::new();
        let same = |h: &LeaseId| current.as_ref().is_some_and(|c| c.token == h.token);
        if let Some(gone) = self.holder.clone().filter(|h| !same(h)) {
            changes.extend(self.ended(gone, true));
        }
        if let Some(info) = current {
            changes.extend(self.acquired(info));
        }
        changes
    }
}

impl Connection {
    /// `GET /v1/events?key=KEY`, from the event after `last_id` when given
    /// (`Last-Event-ID`). Answers once the service has subscribed.
    async fn follow(&self, key: &LockKey, last_id: Option<&str>) -> Result<Events> {
        use eventsource_stream::Eventsource;
        let mut url = self.url(&["v1", "events"]);
        url.query_pairs_mut().append_pair("key", key.as_str());
        let response = self
            .send(url, self.resend_after(), |url| {
                let request = self.request(Method::GET, url);
                match last_id {
                    Some(id) => request.header("last-event-id", id),
                    None => request,
                }
            })
            .await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = response.json::<ErrorBody>().await.map_err(transport)?;
            return Err(refused(status, body));
        }
        Ok(Box::pin(response.bytes_stream().eventsource()))
    }
}

/// The fence of a `fencelock serve` service (`/v1/fences`).
#[derive(Clone, Debug)]
pub struct HttpFence {
    conn: Connection,
}

impl HttpFence {
    /// The fence of the service `url` names.
    pub fn new(url: &str) -> Result<Self> {
        Ok(Self {
            conn: Connection::new(url)?,
        })
    }

    /// `POST /v1/fences/{resource}/admit`, plain or in `mode`.
    async fn admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Option<LockMode>,
    ) -> Result<Admission> {
        let url = self.conn.url(&["v1", "fences", resource, "admit"]);
        let body = AdmitBody {
            token: token.get(),
            mode,
        };
        match self
            .conn
            .json::<FenceBody>(Method::POST, url, Some(&body), &[StatusCode::CONFLICT])
            .await?
        {
            Ok(_) => Ok(Admission::Admitted),
            Err(ErrorBody {
                current: Some(current),
                ..
            }) => Ok(Admission::Stale {
                current: FencingToken(current),
            }),
            Err(refusal) => Err(refused(StatusCode::CONFLICT, refusal)),
        }
    }

    /// `GET /v1/fences/{resource}`.
    async fn state(&self, resource: &str) -> Result<FenceBody> {
        let url = self.conn.url(&["v1", "fences", resource]);
        self.conn
            .json(Method::GET, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))
    }
}

#[async_trait]
impl Fence for HttpFence {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.admit_as(resource, token, None).await
    }

    /// Claimed whatever the service's fence is: a service whose fence does
    /// not record readers and writers apart answers `unsupported`.
    fn shared(&self) -> bool {
        true
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        self.admit_as(resource, token, Some(mode)).await
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let state = self.state(resource).await?;
        if !state.shared {
            return Err(Error::unsupported(NAME, "shared admission"));
        }
        Ok(state.writer.map(FencingToken))
    }

    /// Through the service's fenced key-value store (`/v1/kv`), which
    /// holds JSON: a value that is not JSON is
    /// [`Error::InvalidArgument`], and reads return the value re-serialized
    /// compactly (the same bytes for compact JSON).
    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        let value = serde_json::from_slice(value).map_err(|e| {
            Error::InvalidArgument(format!(
                "a value stored through the service must be JSON: {e}"
            ))
        })?;
        let url = self.conn.url(&["v1", "kv", resource]);
        let body = KvPutBody {
            token: token.get(),
            value,
        };
        match self
            .conn
            .json::<KvBody>(Method::PUT, url, Some(&body), &[StatusCode::CONFLICT])
            .await?
        {
            Ok(_) => Ok(Admission::Admitted),
            Err(ErrorBody {
                current: Some(current),
                ..
            }) => Ok(Admission::Stale {
                current: FencingToken(current),
            }),
            Err(refusal) => Err(refused(StatusCode::CONFLICT, refusal)),
        }
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let url = self.conn.url(&["v1", "kv", resource]);
        match self
            .conn
            .json::<KvBody>(Method::GET, url, None::<&()>, &[StatusCode::NOT_FOUND])
            .await?
        {
            Ok(body) => {
                let value = serde_json::to_vec(&body.value)
                    .map_err(|e| Error::InvalidArgument(format!("unwritable value: {e}")))?;
                Ok(Some(FencedValue::new(FencingToken(body.token), value)))
            }
            Err(refusal) if refusal.code == "not_found" => Ok(None),
            Err(refusal) => Err(refused(StatusCode::NOT_FOUND, refusal)),
        }
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.state(resource).await?.current.map(FencingToken))
    }

    /// `DELETE /v1/fences/{resource}`, which the service takes only with
    /// the admin token (or from anyone when it has no tokens); a client
    /// token is refused.
    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let url = self.conn.url(&["v1", "fences", resource]);
        let reset: ResetBody = self
            .conn
            .json(Method::DELETE, url, None::<&()>, &[])
            .await?
            .map_err(|e| refused(StatusCode::OK, e))?;
        Ok(reset.had.map(FencingToken))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use super::*;

    #[test]
    fn the_password_is_the_token_and_never_shown() {
        let conn = Connection::new("http://:s3cr%2Bt@127.0.0.1:7878").unwrap();
        assert_eq!(conn.token.as_deref(), Some("s3cr+t"));
        assert_eq!(conn.base.as_str(), "http://127.0.0.1:7878/");
        let shown = format!("{conn:?}");
        assert!(!shown.contains("s3cr"), "{shown}");
    }

    #[test]
    fn a_token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  abcdef0123456789\n").unwrap();
        let conn = Connection::new(&format!("http://h:1?token_file={}", path.display())).unwrap();
        assert_eq!(conn.token.as_deref(), Some("abcdef0123456789"));
        assert!(conn.base.query().is_none());
    }

    #[test]
    fn bad_urls_are_invalid_url_errors_without_the_password() {
        for url in [
            "http://:hunter2@h:1?bogus=1",
            "http://:hunter2@h:1?token_file=/nonexistent/token",
            "http://:hunter2@:1",
        ] {
            match Connection::new(url) {
                Err(Error::InvalidUrl(m)) => {
                    assert!(!m.contains("hunter2"), "{m}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn names_are_one_percent_encoded_segment_under_the_base_path() {
        let conn = Connection::new("https://h:1/locks/").unwrap();
        let url = conn.url(&["v1", "locks", "jobs/nightly report?", "acquire"]);
        assert_eq!(
            url.as_str(),
            "https://h:1/locks/v1/locks/jobs%2Fnightly%20report%3F/acquire"
        );
        let root = Connection::new("http://h:1").unwrap();
        assert_eq!(root.url(&["v1", "info"]).as_str(), "http://h:1/v1/info");
    }

    #[test]
    fn a_list_of_replicas_keeps_userinfo_path_and_options_for_all() {
        let (first, others) = split_hosts("http://:t@a:1,b:2,[::1]:3/p?ca_file=x");
        assert_eq!(first, "http://:t@a:1/p?ca_file=x");
        assert_eq!(others, ["b:2", "[::1]:3"]);
        let conn = Connection::new("http://a:1,b,127.0.0.1:3/prefix").unwrap();
        let replicas: Vec<_> = (0..conn.replicas.len())
            .map(|at| {
                let r = conn.replicas.get(at);
                (r.host.as_str(), r.port)
            })
            .collect();
        assert_eq!(
            replicas,
            [("a", Some(1)), ("b", Some(1)), ("127.0.0.1", Some(3))]
        );
        assert_eq!(
            conn.url(&["v1", "info"]).as_str(),
            "http://a:1/prefix/v1/info"
        );
        assert_eq!(split_hosts("http://h:1").1, Vec::<String>::new());
    }

    #[test]
    fn replica_timeout_is_a_duration_above_zero() {
        let conn = Connection::new("http://a:1,b:2/?replica_timeout=250ms").unwrap();
        assert_eq!(conn.replicas.patience, Duration::from_millis(250));
        for bad in ["0s", "soon", ""] {
            let opened = Connection::new(&format!("http://a:1/?replica_timeout={bad}"));
            assert!(
                matches!(&opened, Err(Error::InvalidUrl(m)) if m.contains("replica_timeout")),
                "{bad}: {opened:?}"
            );
        }
    }
}
