//! The REST handlers (`docs/http.md`).

use std::time::Duration;

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Query, Request, State},
    http::{request::Parts, StatusCode},
    Extension, Json,
};
use fencelock_core::{
    validate_data, validate_ttl, validate_value, Error, Fence, FencingToken, Grant, LeaseId,
    LockInfo, LockKey, LockMode, Owner, Stats, WriteIntents,
};
use fencelock_http::wire::{
    AcquireAllBody, AcquireAllGrant, AcquireBody, AdmitBody, CapabilitiesBody, DataBody, FenceBody,
    GrantBody, InfoBody, IntentBody, KvBody, KvPutBody, LockBody, LockList, QueueLeaveBody,
    ReleaseBody, RenewBody, RenewManyBody, RenewManyResults, RenewResult, ResetBody,
    MAX_RENEW_BATCH,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::{
    auth::{admin_only, Caller, Role},
    error::ApiError,
    fair, Service,
};

/// Longest long poll of an acquisition: past it, a client should ask again
/// (proxies and load balancers drop idle requests around a minute).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);
/// Lease length of a renewal that names none: the library's default TTL.
const DEFAULT_RENEW_TTL: Duration = Duration::from_secs(30);
/// Bound on one backend call made by a handler.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time a request's body may take to arrive, once its head has.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request body: axum's default limit, which every route's largest
/// legitimate body (1,000 keys or renewals, a 64 KiB value) fits in.
pub(crate) const MAX_BODY: usize = 2 * 1024 * 1024;
/// Most keys one all-or-nothing acquisition may take (`POST /v1/acquire`),
/// as many as one renewal batch: the backend takes them in one step that
/// holds up everyone else's calls, so its length must stay bounded.
pub(crate) const MAX_KEYS_PER_ACQUIRE: usize = MAX_RENEW_BATCH;
/// Most locks one page of `GET /v1/locks` or of `/v1/activity`'s leases.
pub(crate) const MAX_PAGE: usize = 10_000;

type ApiResult<T> = Result<Json<T>, ApiError>;

/// A JSON body whose every parse failure is a 400 with serde's one-line
/// reason (axum's own `Json` answers 415/422 for some).
pub(crate) struct Body<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // A request being answered is never idle (`crate::conns`): a body
        // sent a byte at a time would hold its connection for good.
        let read = tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(req, state));
        let Ok(read) = read.await else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ));
        };
        let bytes = read.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("the body is larger than the {MAX_BODY} bytes a request may send"),
                )
            } else {
                ApiError::bad_request(format!("unreadable body: {e}"))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
    }
}

/// The one path parameter (a key or a resource), percent-decoded; a
/// decoding failure is a 400.
pub(crate) struct Name(String);

impl<S: Send + Sync> FromRequestParts<S> for Name {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| Name(p.0))
            .map_err(|e| ApiError::bad_request(format!("bad path: {e}")))
    }
}

impl Name {
    fn key(&self) -> Result<LockKey, ApiError> {
        Ok(LockKey::new(self.0.as_str())?)
    }

    /// The name as a fenced resource, which follows the rule of a lock key.
    fn resource(&self) -> Result<&str, ApiError> {
        LockKey::new(self.0.as_str()).map_err(|e| match e {
            Error::InvalidKey(m) => Error::InvalidKey(m.replacen("lock key", "resource name", 1)),
            e => e,
        })?;
        Ok(&self.0)
    }
}

/// Bounds a backend call like the library does, as a 503 when it hangs.
async fn bounded<T>(
    operation: &'static str,
    call: impl std::future::Future<Output = fencelock_core::Result<T>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(OP_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::OperationTimeout {
            operation,
            after: OP_TIMEOUT,
        }
        .into()),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Serialize)]
pub(crate) struct Health {
    status: &'static str,
    backend: &'static str,
}

/// 200 once the backend answers a read.
pub(crate) async fn healthz(State(s): State<Service>) -> ApiResult<Health> {
    let probe = LockKey::new("fencelock/healthz")?;
    let backend = s.inner.client.backend();
    bounded("inspect", backend.inspect(&probe)).await?;
    Ok(Json(Health {
        status: "ok",
        backend: backend.name(),
    }))
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see docs/http.md")
}

pub(crate) async fn info(State(s): State<Service>) -> Json<InfoBody> {
    let backend = s.inner.client.backend();
    Json(InfoBody {
        backend: backend.name().to_owned(),
        capabilities: CapabilitiesBody::from(backend.capabilities()),
        renew_batch: true,
    })
}

pub(crate) async fn acquire(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<AcquireBody>,
) -> ApiResult<GrantBody> {
    let key = name.key()?;
    let wait = Duration::from_millis(body.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::bad_request(format!(
            "wait_ms {} is longer than the {} ms maximum",
            ms(wait),
            ms(MAX_WAIT)
        )));
    }
    if body.queue && !wait.is_zero() {
        return Err(ApiError::bad_request(
            "queue is for single tries; a wait_ms acquire keeps its own queue entry",
        ));
    }
    let owner = match body.owner {
        Some(owner) => caller.owner_in(&owner)?,
        None => caller.owner_in(Owner::generate().as_str())?,
    };
    let owner_name = owner.to_string();
    let owner_name = owner_name.as_str();
    let client = &s.inner.client;
    let shared = body.mode == Some(LockMode::Shared);
    // The service holds no lease: its HTTP client renews and releases.
    let request = |wait: Duration| {
        let mut request = client
            .lock(key.as_str())
            .ttl(Duration::from_millis(body.ttl_ms))
            .wait(wait)
            .owner(owner.clone())
            .queued(body.queue)
            .auto_renew(false)
            .shared(shared);
        if let Some(kind) = body.kind.clone() {
            request = request.kind(kind);
        }
        if let Some(data) = body.data.clone() {
            request = request.data(data);
        }
        if let Some(floor) = body.min_token {
            request = request.min_token(FencingToken(floor));
        }
        request
    };
    let started = tokio::time::Instant::now();
    let _waiting =
        (!wait.is_zero()).then(|| s.inner.activity.waiting(vec![key.to_string()], owner_name));
    // The first try runs in one of the caller's turns (`fair.rs`); the wait
    // after it holds none, and retries what the try could not (held, or a
    // transient failure) as a wait always did.
    let first = {
        let _turn = s.inner.shares.turn(&caller, fair::Lane::Calls).await;
        request(Duration::ZERO).acquire().await
    };
    let acquired = match first {
        Err(_) if started.elapsed() < wait => {
            let rest = wait - started.elapsed();
            until_shutdown(&s, rest, request(rest).acquire()).await?
        }
        first => first,
    };
    match acquired {
        Ok(guard) => {
            let mut grant = GrantBody {
                key: key.to_string(),
                owner: guard.owner().to_string(),
                token: guard.token().get(),
                expires_at: guard.expires_at(),
                ttl_ms: ms(guard.granted_ttl()),
            };
            let ends = tokio::time::Instant::now() + guard.remaining();
            guard.detach();
            s.inner.activity.granted(
                &grant.key,
                &grant.owner,
                grant.token,
                grant.ttl_ms,
                started.elapsed(),
                shared,
            );
            // The table of known leases holds a key's writer; readers reach
            // the stream through its listing.
            if !shared {
                s.inner.events.granted(&grant, ends, body.kind, body.data);
            }
            grant.owner = caller.owner_out(&grant.owner);
            Ok(Json(grant))
        }
        Err(Error::Timeout { .. }) => {
            // Who holds it is a courtesy: a failed look-up still answers 409.
            let holder = bounded("inspect", client.backend().inspect(&key))
                .await
                .ok()
                .flatten()
                .map(|info| shown(&caller, info));
            Err(ApiError::held(key.as_str(), holder))
        }
        Err(e) => Err(e.into()),
    }
}

/// An acquisition that waits `wait`, answered 503 when the service shuts
/// down first: a long poll must not hold the process past its supervisor's
/// stop timeout, and its client asks again elsewhere. A try without a wait
/// is short, and finishes.
async fn until_shutdown<T>(
    s: &Service,
    wait: Duration,
    acquire: impl std::future::Future<Output = T>,
) -> Result<T, ApiError> {
    if wait.is_zero() {
        return Ok(acquire.await);
    }
    tokio::select! {
        acquired = acquire => Ok(acquired),
        () = s.inner.shutdown.cancelled() => Err(ApiError::shutting_down()),
    }
}

/// The lease a caller names: its owner in the caller's namespace, so that
/// a client token can only ever name its own leases.
fn lease(caller: &Caller, key: LockKey, owner: &str, token: u64) -> Result<LeaseId, ApiError> {
    Ok(LeaseId::new(
        key,
        caller.owner_in(owner)?,
        FencingToken(token),
    ))
}

/// A lease as `caller` is shown it (its own namespace left out).
pub(crate) fn shown(caller: &Caller, mut info: LockInfo) -> LockInfo {
    if caller.namespace().is_some() {
        if let Ok(owner) = Owner::new(caller.owner_out(info.owner.as_str())) {
            info.owner = owner;
        }
    }
    info
}

pub(crate) async fn renew(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<RenewBody>,
) -> ApiResult<GrantBody> {
    let lease = lease(&caller, name.key()?, &body.owner, body.token)?
        .with_mode(body.mode.unwrap_or_default());
    let ttl = validate_ttl(body.ttl_ms.map_or(DEFAULT_RENEW_TTL, Duration::from_millis))?;
    let sent = tokio::time::Instant::now();
    let backend = s.inner.client.backend();
    let renewed = bounded("renew", backend.renew(&lease, ttl)).await;
    let stranger = stranger(&s, &lease, &renewed).await;
    count_renewal(backend.name(), sent.elapsed(), &renewed, stranger);
    if !stranger {
        note_renewal(&s, &lease, &renewed);
    }
    let grant = renewed?;
    let mut grant = GrantBody {
        key: lease.key.to_string(),
        owner: lease.owner.to_string(),
        token: grant.token.get(),
        expires_at: grant.expires_at,
        ttl_ms: ms(grant.ttl),
    };
    s.inner.events.renewed(&grant, sent);
    grant.owner = caller.owner_out(&grant.owner);
    Ok(Json(grant))
}

/// `POST /v1/acquire`: every key or none (`LockClient::lock_all`: one
/// atomic step where the backend has one, else in sorted order with nothing
/// left held on failure), waiting as `acquire` does.
pub(crate) async fn acquire_all(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    Body(body): Body<AcquireAllBody>,
) -> ApiResult<AcquireAllGrant> {
    let wait = Duration::from_millis(body.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::bad_request(format!(
            "wait_ms {} is longer than the {} ms maximum",
            ms(wait),
            ms(MAX_WAIT)
        )));
    }
    if body.keys.len() > MAX_KEYS_PER_ACQUIRE {
        return Err(ApiError::bad_request(format!(
            "{} keys in one acquisition; the limit is {MAX_KEYS_PER_ACQUIRE}",
            body.keys.len()
        )));
    }
    let owner = match body.owner {
        Some(owner) => caller.owner_in(&owner)?,
        None => caller.owner_in(Owner::generate().as_str())?,
    };
    let owner_name = owner.to_string();
    let keys = body.keys.clone();
    // One client's multi-key steps run one maximal step at a time, so that
    // its burst holds up others by at most one step (`docs/http.md`,
    // "Threat model").
    let _turn = s.inner.shares.keys(&caller, keys.len()).await;
    let client = &s.inner.client;
    let mut request = client
        .lock_all(body.keys)
        .ttl(Duration::from_millis(body.ttl_ms))
        .wait(wait)
        .owner(owner)
        .auto_renew(false);
    if let Some(kind) = body.kind.clone() {
        request = request.kind(kind);
    }
    if let Some(data) = body.data.clone() {
        request = request.data(data);
    }
    for (key, floor) in body.min_tokens {
        request = request.min_token_of(key, FencingToken(floor));
    }
    let started = tokio::time::Instant::now();
    let _waiting = (!wait.is_zero()).then(|| s.inner.activity.waiting(keys, &owner_name));
    match until_shutdown(&s, wait, request.acquire()).await? {
        Ok(all) => {
            let now = tokio::time::Instant::now();
            let waited = now - started;
            let grants = all
                .guards()
                .iter()
                .map(|guard| {
                    let grant = GrantBody {
                        key: guard.key().to_string(),
                        owner: guard.owner().to_string(),
                        token: guard.token().get(),
                        expires_at: guard.expires_at(),
                        ttl_ms: ms(guard.granted_ttl()),
                    };
                    s.inner.events.granted(
                        &grant,
                        now + guard.remaining(),
                        body.kind.clone(),
                        body.data.clone(),
                    );
                    s.inner.activity.granted(
                        &grant.key,
                        &grant.owner,
                        grant.token,
                        grant.ttl_ms,
                        waited,
                        false,
                    );
                    GrantBody {
                        owner: caller.owner_out(&grant.owner),
                        ..grant
                    }
                })
                .collect();
            all.detach();
            Ok(Json(AcquireAllGrant { grants }))
        }
        Err(Error::Timeout { key, .. }) => {
            let holder = bounded("inspect", client.backend().inspect(&key))
                .await
                .ok()
                .flatten()
                .map(|info| shown(&caller, info));
            Err(ApiError::held(key.as_str(), holder))
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/renew`: a client's due leases in one request, renewed with the
/// backend's batch call (one round trip where the backend has one), each
/// judged as `renew` judges one lease.
pub(crate) async fn renew_many(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    Body(body): Body<RenewManyBody>,
) -> ApiResult<RenewManyResults> {
    use fencelock_core::Renewal;
    if body.leases.len() > MAX_RENEW_BATCH {
        return Err(ApiError::bad_request(format!(
            "{} leases in one renewal; the limit is {MAX_RENEW_BATCH}",
            body.leases.len()
        )));
    }
    let mut results: Vec<Result<Grant, ApiError>> = Vec::new();
    // The valid renewals, readers' and writers' alike, each with its place
    // in the answer.
    let (mut places, mut renewals) = (Vec::new(), Vec::new());
    for (i, item) in body.leases.iter().enumerate() {
        let renewal = LockKey::new(item.key.as_str())
            .map_err(ApiError::from)
            .and_then(|key| lease(&caller, key, &item.owner, item.token))
            .and_then(|lease| {
                let ttl = item.ttl_ms.map_or(DEFAULT_RENEW_TTL, Duration::from_millis);
                let lease = lease.with_mode(item.mode.unwrap_or_default());
                Ok(Renewal::new(lease, validate_ttl(ttl)?))
            });
        match renewal {
            Ok(renewal) => {
                places.push(i);
                renewals.push(renewal);
                // Replaced by its batch's outcome below.
                results.push(Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "not renewed",
                )));
            }
            Err(e) => results.push(Err(e)),
        }
    }
    let backend = s.inner.client.backend();
    let sent = tokio::time::Instant::now();
    if !renewals.is_empty() {
        let renewed = bounded("renew", backend.renew_many(&renewals)).await;
        // No answer for the batch is no answer for each of its leases.
        let renewed: Vec<Result<Grant, ApiError>> = match renewed {
            Ok(each) => each
                .into_iter()
                .map(|r| r.map_err(ApiError::from))
                .collect(),
            Err(e) => {
                let (status, body) = e.into_parts();
                renewals
                    .iter()
                    .map(|_| Err(ApiError::new(status, &body.code, &body.error)))
                    .collect()
            }
        };
        for ((&place, renewal), outcome) in places.iter().zip(&renewals).zip(renewed) {
            let stranger = stranger(&s, &renewal.lease, &outcome).await;
            count_renewal(backend.name(), sent.elapsed(), &outcome, stranger);
            if !stranger {
                note_renewal(&s, &renewal.lease, &outcome);
            }
            results[place] = outcome;
        }
    }
    let results = body
        .leases
        .iter()
        .zip(results)
        .map(|(item, outcome)| match outcome {
            Ok(grant) => {
                let grant = GrantBody {
                    key: item.key.clone(),
                    owner: caller
                        .owner_in(&item.owner)
                        .map_or_else(|_| item.owner.clone(), |owner| owner.to_string()),
                    token: grant.token.get(),
                    expires_at: grant.expires_at,
                    ttl_ms: ms(grant.ttl),
                };
                s.inner.events.renewed(&grant, sent);
                RenewResult {
                    status: StatusCode::OK.as_u16(),
                    grant: Some(GrantBody {
                        owner: caller.owner_out(&grant.owner),
                        ..grant
                    }),
                    error: None,
                }
            }
            Err(e) => {
                let (status, error) = e.into_parts();
                RenewResult {
                    status: status.as_u16(),
                    grant: None,
                    error: Some(error),
                }
            }
        })
        .collect();
    Ok(Json(RenewManyResults { results }))
}

/// Whether a refused renewal of `lease` named someone else's live lease:
/// the key's current lease has its token and another owner. The refusal is
/// then the caller's mistake (or probe), never the holder's loss: neither
/// the holder's record in `/v1/activity` nor `fencelock_locks_lost_total`
/// may change for it. One read of the key, for refusals only.
async fn stranger(s: &Service, lease: &LeaseId, outcome: &Result<Grant, ApiError>) -> bool {
    if !matches!(outcome, Err(e) if e.code() == "not_held") {
        return false;
    }
    let current = bounded("inspect", s.inner.client.backend().inspect(&lease.key)).await;
    let stranger = matches!(
        current,
        Ok(Some(info)) if info.token == lease.token && info.owner != lease.owner
    );
    if stranger {
        tracing::info!(key = %lease.key, owner = %lease.owner, token = %lease.token,
            "refused a renewal naming another owner's lease");
    }
    stranger
}

/// Counts an HTTP client's renewal under the names the library's renewer
/// uses (`docs/observability.md`), so that the shipped dashboards and
/// alerts cover clients in every language: the round trip, a confirmed
/// renewal or a failed one, and a refusal, which ends the client's lock
/// (`LockLost` with reason `refused`, as its own renewer would count it)
/// unless the caller named a lease that was never its own (`stranger`).
fn count_renewal(
    backend: &'static str,
    took: Duration,
    outcome: &Result<Grant, ApiError>,
    stranger: bool,
) {
    use fencelock_core::metrics as m;
    ::metrics::histogram!(m::RENEW_SECONDS, "backend" => backend).record(took.as_secs_f64());
    match outcome {
        Ok(_) => ::metrics::counter!(m::RENEWALS, "backend" => backend).increment(1),
        Err(e) => {
            ::metrics::counter!(m::RENEWAL_FAILURES, "backend" => backend).increment(1);
            if e.code() == "not_held" && !stranger {
                ::metrics::counter!(m::LOCKS_LOST, "backend" => backend, "reason" => "refused")
                    .increment(1);
            }
        }
    }
}

/// Keeps a renewal's outcome for `GET /v1/activity`.
fn note_renewal(s: &Service, lease: &LeaseId, outcome: &Result<Grant, ApiError>) {
    s.inner.activity.renewal(
        lease.key.as_str(),
        lease.owner.as_str(),
        lease.token.get(),
        outcome.as_ref().map(|g| g.ttl).map_err(ApiError::code),
    );
}

#[derive(Serialize)]
pub(crate) struct Released {
    released: bool,
}

pub(crate) async fn release(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<Released> {
    let lease = lease(&caller, name.key()?, &body.owner, body.token)?
        .with_mode(body.mode.unwrap_or_default());
    let backend = s.inner.client.backend();
    bounded("release", backend.release(&lease)).await?;
    s.inner.events.gone(
        "released",
        lease.key.as_str(),
        Some(lease.owner.as_str()),
        lease.token.get(),
    );
    Ok(Json(Released { released: true }))
}

/// Posts (or refreshes) a waiting writer's intent, which keeps new readers
/// out of the key (`docs/rwlock.md`); the owner is in the caller's
/// namespace like every other.
pub(crate) async fn post_intent(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<IntentBody>,
) -> ApiResult<Updated> {
    let key = name.key()?;
    let owner = caller.owner_in(&body.owner)?;
    let Some(ttl_ms) = body.ttl_ms else {
        return Err(ApiError::bad_request("an intent needs ttl_ms"));
    };
    let ttl = validate_ttl(Duration::from_millis(ttl_ms))?;
    bounded(
        "post_write_intent",
        intents(&s)?.post_write_intent(&key, &owner, ttl),
    )
    .await?;
    Ok(Json(Updated { updated: true }))
}

/// Withdraws the caller's writer intent on the key (none: nothing to do).
pub(crate) async fn withdraw_intent(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<IntentBody>,
) -> ApiResult<Updated> {
    let key = name.key()?;
    let owner = caller.owner_in(&body.owner)?;
    bounded(
        "withdraw_write_intent",
        intents(&s)?.withdraw_write_intent(&key, &owner),
    )
    .await?;
    Ok(Json(Updated { updated: true }))
}

/// The backend's writer intents, or `unsupported` from a backend without
/// read-write locks.
fn intents(s: &Service) -> Result<&dyn WriteIntents, ApiError> {
    let backend = s.inner.client.backend();
    backend
        .write_intents()
        .ok_or_else(|| fencelock_core::Error::unsupported(backend.name(), "shared locks").into())
}

/// The live queue entries of a key on a fair backend, oldest first
/// (`docs/fairness.md`); empty elsewhere.
pub(crate) async fn queue(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
) -> ApiResult<LockList> {
    let key = name.key()?;
    let entries = match s.inner.client.backend().fair_queue() {
        Some(queue) => bounded("queue", queue.queue(&key)).await?,
        None => Vec::new(),
    };
    Ok(Json(LockList {
        locks: entries
            .into_iter()
            .map(|info| LockBody {
                info: shown(&caller, info),
                ttl_ms: None,
            })
            .collect(),
    }))
}

/// Withdraws the caller's queue entry on the key (a wait the client ran
/// with single tries ended without a grant); none: nothing to do.
pub(crate) async fn leave_queue(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<QueueLeaveBody>,
) -> ApiResult<Updated> {
    let key = name.key()?;
    let owner = caller.owner_in(&body.owner)?;
    if let Some(queue) = s.inner.client.backend().fair_queue() {
        bounded("leave_queue", queue.leave_queue(&key, &owner)).await?;
    }
    Ok(Json(Updated { updated: true }))
}

/// Replaces a held lease's data (an election leader's `proclaim`).
pub(crate) async fn set_data(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
    Body(body): Body<DataBody>,
) -> ApiResult<Updated> {
    let lease = lease(&caller, name.key()?, &body.owner, body.token)?;
    if let Some(data) = &body.data {
        validate_data(data)?;
    }
    bounded(
        "set_data",
        s.inner.client.backend().set_data(&lease, body.data),
    )
    .await?;
    Ok(Json(Updated { updated: true }))
}

#[derive(Serialize)]
pub(crate) struct Updated {
    updated: bool,
}

pub(crate) async fn inspect(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
) -> ApiResult<LockBody> {
    let key = name.key()?;
    match bounded("inspect", s.inner.client.backend().inspect(&key)).await? {
        Some(info) => Ok(Json(s.inner.events.body(shown(&caller, info)))),
        None => Err(ApiError::not_found(format!("lock {key} is not held"))),
    }
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    prefix: Option<String>,
    /// Most locks in the answer (at most [`MAX_PAGE`]); with it, the
    /// answer has `next`.
    limit: Option<usize>,
    /// Only keys after this one (the last page's `next`).
    after: Option<String>,
}

/// `GET /v1/locks`: without `limit`, every lock (as before paging); with
/// it, a page and the cursor of the next.
#[derive(Serialize)]
pub(crate) struct LockPage {
    locks: Vec<LockBody>,
    /// The `after` of the next page; `null` on the last. Only with `limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<Option<String>>,
}

/// A page of `items` sorted by `key` when `limit` asks for one
/// ([`fencelock_core::page_by_key`]: a key's leases are never split), with
/// the cursor of the next page; everything, and no cursor, without.
pub(crate) fn page<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> &str,
    limit: Option<usize>,
    after: Option<&str>,
) -> Result<(Vec<T>, Option<Option<String>>), ApiError> {
    let Some(limit) = limit else {
        return Ok((items, None));
    };
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit {limit}: a page holds 1 to {MAX_PAGE}"
        )));
    }
    let (page, next) = fencelock_core::page_by_key(items, key, after, limit);
    Ok((page, Some(next)))
}

pub(crate) async fn list(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<LockPage> {
    let mut locks = bounded(
        "list",
        s.inner
            .client
            .backend()
            .administer()?
            .list(q.prefix.as_deref()),
    )
    .await?;
    locks.sort_by(|a, b| a.key.cmp(&b.key));
    let (locks, next) = page(locks, |l| l.key.as_str(), q.limit, q.after.as_deref())?;
    Ok(Json(LockPage {
        locks: locks
            .into_iter()
            .map(|l| s.inner.events.body(shown(&caller, l)))
            .collect(),
        next,
    }))
}

#[derive(Serialize)]
pub(crate) struct Removed {
    removed: LockBody,
}

pub(crate) async fn force_release(
    State(s): State<Service>,
    Extension(role): Extension<Role>,
    name: Name,
) -> ApiResult<Removed> {
    admin_only(role)?;
    let key = name.key()?;
    match bounded(
        "force_release",
        s.inner.client.backend().administer()?.force_release(&key),
    )
    .await?
    {
        Some(info) => {
            tracing::info!(key = %info.key, owner = %info.owner, token = %info.token, "force-released");
            s.inner.events.gone(
                "lost",
                info.key.as_str(),
                Some(info.owner.as_str()),
                info.token.get(),
            );
            Ok(Json(Removed {
                removed: s.inner.events.body(info),
            }))
        }
        None => Err(ApiError::not_found(format!("lock {key} is not held"))),
    }
}

#[derive(Serialize)]
pub(crate) struct ReleasedAll {
    released: u64,
}

/// Releases every lease of an owner, in the caller's namespace: a client
/// token releases only its own owners' leases.
pub(crate) async fn release_all(
    State(s): State<Service>,
    Extension(caller): Extension<Caller>,
    name: Name,
) -> ApiResult<ReleasedAll> {
    let owner = caller.owner_in(&name.0)?;
    let released = bounded(
        "release_all",
        s.inner.client.backend().administer()?.release_all(&owner),
    )
    .await?;
    Ok(Json(ReleasedAll { released }))
}

#[derive(Serialize)]
pub(crate) struct StatsBody {
    #[serde(flatten)]
    stats: Stats,
    /// Acquisitions long-polling through this service now.
    waiters: u64,
}

pub(crate) async fn stats(State(s): State<Service>) -> ApiResult<StatsBody> {
    let stats = bounded("stats", s.inner.client.backend().administer()?.stats()).await?;
    Ok(Json(StatsBody {
        stats,
        waiters: s.inner.activity.waiters(),
    }))
}

#[derive(Serialize)]
pub(crate) struct Cleaned {
    deleted: u64,
}

pub(crate) async fn cleanup(
    State(s): State<Service>,
    Extension(role): Extension<Role>,
) -> ApiResult<Cleaned> {
    admin_only(role)?;
    let deleted = bounded(
        "cleanup",
        s.inner.client.backend().administer()?.cleanup_expired(),
    )
    .await?;
    Ok(Json(Cleaned { deleted }))
}

fn fence(s: &Service) -> Result<&dyn Fence, ApiError> {
    s.inner.fence.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported",
            "this service has no fence",
        )
    })
}

/// Admits `token` at `resource` (in `mode`, when given: `docs/rwlock.md`),
/// reporting a refusal on the event stream.
async fn admit_token(
    s: &Service,
    resource: &str,
    token: FencingToken,
    mode: Option<LockMode>,
) -> Result<(), ApiError> {
    let fence = fence(s)?;
    let admitted = match mode {
        None => bounded("admit", fence.admit(resource, token)).await,
        Some(mode) => bounded("admit", fence.admit_shared(resource, token, mode)).await,
    };
    match admitted {
        Err(e) => {
            if let Some(current) = e.current() {
                s.inner.events.fenced_out(resource, token.get(), current);
            }
            Err(e)
        }
        ok => ok,
    }
}

/// A fence's state: its highest token, and its highest writer's on a fence
/// that records them apart.
async fn fence_state(s: &Service, resource: String) -> ApiResult<FenceBody> {
    let fence = fence(s)?;
    let current = bounded("highest", fence.highest(&resource)).await?;
    let writer = if fence.shared() {
        bounded("highest writer", fence.highest_writer(&resource)).await?
    } else {
        None
    };
    Ok(Json(FenceBody {
        resource,
        current: current.map(FencingToken::get),
        shared: fence.shared(),
        writer: writer.map(FencingToken::get),
    }))
}

/// `token` if the lock store can have issued it, where the fence serves
/// that store's tokens: never 0 (tokens start at 1) nor above
/// [`FencingToken::MAX`], and never above the latest token the store
/// issued for the key named like `resource`. Admitting such a token would
/// refuse every real holder at that resource for good. A fence of its own
/// (an embedding program's) may be shown tokens from elsewhere, so it is
/// shown every token.
async fn issued(s: &Service, resource: &str, token: u64) -> Result<FencingToken, ApiError> {
    if !s.inner.fence_shares_store {
        return Ok(FencingToken(token));
    }
    if token == 0 || token > FencingToken::MAX.get() {
        return Err(Error::InvalidToken(format!(
            "token {token} was never issued: tokens are 1 to {}",
            FencingToken::MAX.get()
        ))
        .into());
    }
    // A resource named like no key is protected by no lock of this store:
    // a token admitted there blocks no holder.
    let Ok(key) = LockKey::new(resource) else {
        return Ok(FencingToken(token));
    };
    if let Some(latest) = latest_issued(s, &key).await? {
        if token > latest {
            return Err(Error::InvalidToken(format!(
                "token {token} was never issued for {resource}: the lock store's \
                 latest is {latest}"
            ))
            .into());
        }
    }
    Ok(FencingToken(token))
}

/// Who takes the key for a moment to learn the store's next token.
const TOKEN_PROBE_OWNER: &str = "fencelock-serve:token-probe";
/// The probe's lease: short, so that a release that fails blocks the key
/// no longer than this, and whole seconds, which every engine grants as
/// asked (etcd's leases are).
const TOKEN_PROBE_TTL: Duration = Duration::from_secs(1);

/// The latest token the lock store issued for `key`, where it can tell:
/// the live writer's (its grant was the latest), or, on a free key, one
/// below the token of a grant taken and handed back at once (every token
/// issued before it is below it, I2). `None` while readers hold the key,
/// or a foreign holder without a token (a coexistence layout).
async fn latest_issued(s: &Service, key: &LockKey) -> Result<Option<u64>, ApiError> {
    let writer = |info: Option<LockInfo>| {
        info.filter(|l| l.mode == LockMode::Exclusive && l.token.get() > 0)
            .map(|l| l.token.get())
    };
    let backend = s.inner.client.backend();
    let live = bounded("inspect", backend.inspect(key)).await?;
    if live.is_some() {
        return Ok(writer(live));
    }
    let probe = fencelock_core::AcquireRequest::new(
        key.clone(),
        Owner::new(TOKEN_PROBE_OWNER)?,
        TOKEN_PROBE_TTL,
    );
    match bounded("acquire", backend.try_acquire(&probe)).await? {
        fencelock_core::Acquire::Granted(grant) => {
            let lease = probe.lease(grant.token);
            match tokio::time::timeout(OP_TIMEOUT, backend.release(&lease)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(key = %key, error = %e, "releasing the token probe failed; it expires")
                }
                Err(_) => {
                    tracing::warn!(key = %key, "releasing the token probe got no answer; it expires")
                }
            }
            Ok(Some(grant.token.get().saturating_sub(1)))
        }
        fencelock_core::Acquire::Held(holder) => Ok(writer(holder)),
    }
}

pub(crate) async fn admit(
    State(s): State<Service>,
    name: Name,
    Body(body): Body<AdmitBody>,
) -> ApiResult<FenceBody> {
    let resource = name.resource()?;
    let token = issued(&s, resource, body.token).await?;
    admit_token(&s, &name.0, token, body.mode).await?;
    fence_state(&s, name.0).await
}

/// `DELETE /v1/fences/{resource}` and `DELETE /v1/kv/{key}` (admin): forgets
/// the fence's tokens and the value stored with them, the repair of a
/// resource a bogus token has blocked; published on the event stream as
/// `reset`, and logged.
pub(crate) async fn reset_fence(
    State(s): State<Service>,
    Extension(role): Extension<Role>,
    name: Name,
) -> ApiResult<ResetBody> {
    admin_only(role)?;
    let resource = name.resource()?;
    let had = bounded("reset", fence(&s)?.reset(resource)).await?;
    tracing::warn!(resource, had = ?had.map(FencingToken::get), "fence reset by an admin");
    s.inner.events.reset(resource, had.map(FencingToken::get));
    Ok(Json(ResetBody {
        resource: resource.to_owned(),
        had: had.map(FencingToken::get),
    }))
}

pub(crate) async fn fence_current(State(s): State<Service>, name: Name) -> ApiResult<FenceBody> {
    name.resource()?;
    fence_state(&s, name.0).await
}

/// The fence behind the fenced key-value store: one that keeps values in
/// its own store ([`Fence::values`]), so that they outlive this process and
/// every replica over the same backend sees the same ones.
fn value_fence(s: &Service) -> Result<&dyn Fence, ApiError> {
    let fence = fence(s)?;
    if !fence.values() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported",
            format!("the {} fence keeps no values", fence.name()),
        ));
    }
    Ok(fence)
}

pub(crate) async fn kv_put(
    State(s): State<Service>,
    name: Name,
    Body(body): Body<KvPutBody>,
) -> ApiResult<KvBody> {
    let key = name.resource()?;
    let bytes = serde_json::to_vec(&body.value)
        .map_err(|e| ApiError::bad_request(format!("unwritable value: {e}")))?;
    validate_value(&bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "value_too_large", e))?;
    let token = issued(&s, key, body.token).await?;
    // The fence admits the token and stores the value in one atomic step
    // of its backend, so concurrent writers need no lock here.
    let written = bounded(
        "write a value",
        value_fence(&s)?.write_value(key, token, &bytes),
    )
    .await;
    if let Err(e) = &written {
        if let Some(current) = e.current() {
            s.inner.events.fenced_out(key, token.get(), current);
        }
    }
    written?;
    Ok(Json(KvBody {
        key: key.to_owned(),
        token: body.token,
        value: body.value,
    }))
}

pub(crate) async fn kv_get(State(s): State<Service>, name: Name) -> ApiResult<KvBody> {
    let key = name.resource()?;
    match bounded("read a value", value_fence(&s)?.read_value(key)).await? {
        Some(stored) => Ok(Json(KvBody {
            key: key.to_owned(),
            token: stored.token.get(),
            // Only a program writing through the library directly can
            // store bytes that are not JSON.
            value: serde_json::from_slice(&stored.value).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("the value stored for {key} is not JSON: {e}"),
                )
            })?,
        })),
        None => Err(ApiError::not_found(format!("no value for {key}"))),
    }
}

impl crate::events::Events {
    /// A lease as the API shows it, with the TTL last granted through this
    /// service when it knows it.
    pub(crate) fn body(&self, info: LockInfo) -> LockBody {
        let ttl_ms = self.ttl_ms(info.key.as_str(), info.token.get());
        LockBody { info, ttl_ms }
    }
}
