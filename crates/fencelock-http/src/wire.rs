//! The JSON bodies of the lock service's REST API (`docs/http.md`).
//!
//! Times are RFC 3339 on the backend's clock, durations integer
//! milliseconds, tokens unsigned 64-bit integers.

use chrono::{DateTime, Utc};
use fencelock_core::{Capabilities, LockInfo, LockMode};
use serde::{Deserialize, Serialize};

/// `POST /v1/locks/{key}/acquire`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Who asks; the service makes up a unique owner when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The lease length asked for.
    pub ttl_ms: u64,
    /// How long to wait for a held lock (long poll), bounded by the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Label stored with the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// JSON metadata stored with the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// `shared` for a reader's lease of a read-write lock, on backends
    /// that offer them (`exclusive`, the plain lock, when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// A floor for the grant's token, on backends that support one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_token: Option<u64>,
    /// One try of a wait the client runs itself, on a fair backend
    /// (`docs/fairness.md`): a refusal leaves or refreshes the owner's
    /// queue entry on the key, which the client keeps by trying again
    /// within a third of `ttl_ms` and withdraws with
    /// `POST /v1/locks/{key}/queue/leave`. Only without `wait_ms`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue: bool,
}

/// `POST /v1/locks/{key}/queue/leave`: a waiter's queue entry withdrawn.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueLeaveBody {
    /// The waiter.
    pub owner: String,
}

/// The answer to a granted acquisition or renewal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrantBody {
    /// The lock.
    pub key: String,
    /// The holder: present it, with the token, to renew and release.
    pub owner: String,
    /// The fencing token: present it to every fenced resource.
    pub token: u64,
    /// When the lease ends on the backend's clock (for display: trust
    /// `ttl_ms` from before the request was sent instead).
    pub expires_at: DateTime<Utc>,
    /// The lease length the backend granted.
    pub ttl_ms: u64,
}

/// `POST /v1/locks/{key}/renew`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The holder.
    pub owner: String,
    /// The grant's token.
    pub token: u64,
    /// The new lease length from now (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// `shared` for a reader's lease (exclusive when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// `POST /v1/acquire`: every key or none, as `LockClient::lock_all`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireAllBody {
    /// The keys (sorted and de-duplicated by the service; at least one).
    pub keys: Vec<String>,
    /// Who asks; the service makes up a unique owner when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The lease length of every key.
    pub ttl_ms: u64,
    /// How long to wait for all of them (one deadline), bounded by the
    /// service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Label stored with every lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// JSON metadata stored with every lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Token floors of some keys, by key, on backends that support one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub min_tokens: std::collections::BTreeMap<String, u64>,
}

/// The answer to a granted `POST /v1/acquire`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AcquireAllGrant {
    /// One grant per key, sorted by key; renew and release each on its own.
    pub grants: Vec<GrantBody>,
}

/// One lease of a `POST /v1/renew` batch.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewItem {
    /// The lock.
    pub key: String,
    /// The holder.
    pub owner: String,
    /// The grant's token.
    pub token: u64,
    /// The new lease length from now (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// `shared` for a reader's lease (exclusive when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// `POST /v1/renew`: several leases renewed in one request, each as
/// `POST /v1/locks/{key}/renew` would (at most [`MAX_RENEW_BATCH`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewManyBody {
    /// The leases, in the order of the answer's results.
    pub leases: Vec<RenewItem>,
}

/// Most leases one `POST /v1/renew` takes.
pub const MAX_RENEW_BATCH: usize = 1000;

/// The answer to `POST /v1/renew`: one result per lease, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RenewManyResults {
    /// `status` 200 with `grant`, or the status and `error` that
    /// `POST /v1/locks/{key}/renew` would have answered for this lease.
    pub results: Vec<RenewResult>,
}

/// One lease's outcome in [`RenewManyResults`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RenewResult {
    /// The HTTP status the single renewal would have had.
    pub status: u16,
    /// The renewal, when `status` is 200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantBody>,
    /// The refusal otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `POST /v1/locks/{key}/release`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holder.
    pub owner: String,
    /// The grant's token.
    pub token: u64,
    /// `shared` for a reader's lease (exclusive when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// `POST /v1/locks/{key}/intent` (a waiting writer's intent, which keeps
/// new readers out: `docs/rwlock.md`) and `POST /v1/locks/{key}/intent/withdraw`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntentBody {
    /// The waiting writer.
    pub owner: String,
    /// How long the intent lasts unless posted again (posting only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// `PUT /v1/locks/{key}/data`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataBody {
    /// The holder.
    pub owner: String,
    /// The grant's token.
    pub token: u64,
    /// The new data (`null` removes it).
    pub data: Option<serde_json::Value>,
}

/// A lease as `GET /v1/locks/{key}` and `GET /v1/locks` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockBody {
    /// Key, owner, token, kind, data, `acquired_at`, `expires_at` and
    /// `expires_in_ms` (measured on the backend's clock).
    #[serde(flatten)]
    pub info: LockInfo,
    /// The lease length last granted through this service, when it knows
    /// it (backends do not store it).
    pub ttl_ms: Option<u64>,
}

/// `GET /v1/locks`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LockList {
    /// Unexpired leases, sorted by key.
    pub locks: Vec<LockBody>,
}

/// `POST /v1/fences/{resource}/admit`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmitBody {
    /// The token to admit.
    pub token: u64,
    /// The mode of the lease the token is from, on a fence that records
    /// readers and writers apart (`docs/rwlock.md`): a reader's token
    /// (`shared`) is admitted iff it is at least the highest writer's. When
    /// absent, a plain admission (a writer's, on such a fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// A fence's state: the answer to an admission and to
/// `GET /v1/fences/{resource}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FenceBody {
    /// The fenced resource.
    pub resource: String,
    /// The highest token admitted, if any.
    pub current: Option<u64>,
    /// Whether the fence records readers' and writers' tokens apart (then
    /// `writer` is its highest writer token); absent from services before
    /// it.
    #[serde(default)]
    pub shared: bool,
    /// With `shared`: the highest writer token admitted, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<u64>,
}

/// `PUT /v1/kv/{key}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPutBody {
    /// The writer's fencing token.
    pub token: u64,
    /// The value.
    pub value: serde_json::Value,
}

/// A value of the fenced key-value store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvBody {
    /// The key.
    pub key: String,
    /// The token of the write that stored it.
    pub token: u64,
    /// The value.
    pub value: serde_json::Value,
}

/// The answer to an admin's `DELETE /v1/fences/{resource}` (and
/// `DELETE /v1/kv/{key}`): the fence of that name is forgotten.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResetBody {
    /// The resource whose fence was reset.
    pub resource: String,
    /// The highest token the fence had admitted, if any.
    pub had: Option<u64>,
}

/// `GET /v1/info`: what the service's backend is and can do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InfoBody {
    /// The backend's name (`sqlite`, `postgres`, …).
    pub backend: String,
    /// The backend's capabilities, by name.
    pub capabilities: CapabilitiesBody,
    /// Whether the service takes `POST /v1/renew` (absent from services
    /// before it: clients then renew one lease per request).
    #[serde(default)]
    pub renew_batch: bool,
}

/// [`Capabilities`] on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapabilitiesBody {
    /// See [`Capabilities::wakeups`].
    pub wakeups: bool,
    /// See [`Capabilities::persistent`].
    pub persistent: bool,
    /// See [`Capabilities::keeps_expired`].
    pub keeps_expired: bool,
    /// See [`Capabilities::min_token`].
    pub min_token: bool,
    /// See [`Capabilities::watch`].
    pub watch: bool,
    /// See [`Capabilities::batch_renew`].
    pub batch_renew: bool,
    /// See [`Capabilities::set_data`].
    pub set_data: bool,
    /// See [`Capabilities::shared`] (absent from services before it).
    #[serde(default)]
    pub shared: bool,
    /// See [`Capabilities::atomic_multi`] (absent from services before it).
    #[serde(default)]
    pub atomic_multi: bool,
    /// See [`Capabilities::fair`] (absent from services before it).
    #[serde(default)]
    pub fair: bool,
}

impl From<Capabilities> for CapabilitiesBody {
    fn from(c: Capabilities) -> Self {
        Self {
            wakeups: c.wakeups,
            persistent: c.persistent,
            keeps_expired: c.keeps_expired,
            min_token: c.min_token,
            watch: c.watch,
            batch_renew: c.batch_renew,
            set_data: c.set_data,
            shared: c.shared,
            atomic_multi: c.atomic_multi,
            fair: c.fair,
        }
    }
}

/// The body of every refusal: a one-line reason and a stable code.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One line for people.
    pub error: String,
    /// One of the codes listed in `docs/http.md`, for programs:
    /// `bad_request`, `invalid_key`, `invalid_owner`, `invalid_ttl`,
    /// `invalid_token`, `unsupported`, `unauthorized`, `forbidden`,
    /// `not_found`, `held`, `not_held`, `stale`, `unavailable`, `timeout`,
    /// `internal`.
    pub code: String,
    /// With `held`: the current holder, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<LockInfo>,
    /// With `stale`: the highest token admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
}

/// One server-sent event of `GET /v1/events` (its SSE `event:` field is
/// [`EventBody::kind`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventBody {
    /// `acquired`, `released`, `expired`, `lost` (force-released, or a
    /// renewal refused) or `fenced_out` (a fence refused a stale token).
    #[serde(rename = "type")]
    pub kind: String,
    /// The lock key, or with `fenced_out` the resource.
    pub key: String,
    /// The holder, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The lease's token, or with `fenced_out` the refused token.
    pub token: u64,
    /// With `acquired`: the whole lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockBody>,
    /// With `fenced_out`: the highest token admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// When the service saw it (its own clock).
    pub at: DateTime<Utc>,
}
