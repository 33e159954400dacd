//! Every refusal as an HTTP status and an [`ErrorBody`]: a one-line reason
//! and a stable code.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use fencelock_core::{Error, LockInfo};
use fencelock_http::wire::ErrorBody;

/// The longest `error` text of a refusal, in bytes: longer ones (a
/// parser quoting a huge request) are shortened.
const MAX_MESSAGE: usize = 512;

/// A refusal.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    // Boxed: handlers pass refusals up through `?` on every path.
    body: Box<ErrorBody>,
    /// When the client should ask again (`retry_after_ms` and the
    /// `Retry-After` header).
    retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Self {
        // One line, whatever the source said, and not a long input echoed
        // whole (a parser's message may quote the request).
        let error = message
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let error = fencelock_core::shorten_to(&error, MAX_MESSAGE).into_owned();
        Self {
            status,
            body: Box::new(ErrorBody {
                error,
                code: code.to_owned(),
                holder: None,
                current: None,
            }),
            retry_after: None,
        }
    }

    /// 503: this replica is shutting down and did nothing with the request;
    /// ask again, which finds another replica (this one no longer takes
    /// connections) or, behind a balancer, the next one it picks.
    pub(crate) fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this replica is shutting down; ask again (another replica answers)",
        );
        e.retry_after = Some(RETRY_AFTER_SHUTDOWN);
        e
    }

    /// 503: every connection this replica may keep is busy with a request
    /// (its `max_connections`), so this one, opened on a spare, is answered
    /// at once and closed; ask again, here or at another replica.
    pub(crate) fn overloaded() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "every connection this replica keeps is busy (max_connections); ask again",
        );
        e.retry_after = Some(RETRY_AFTER_OVERLOAD);
        e
    }

    /// The status and body, for an answer that carries several outcomes.
    pub(crate) fn into_parts(self) -> (StatusCode, ErrorBody) {
        (self.status, *self.body)
    }

    pub(crate) fn bad_request(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// With a `stale` refusal: the highest token admitted.
    pub(crate) fn current(&self) -> Option<u64> {
        self.body.current
    }

    /// The refusal's stable code (`not_held`, `held`, …).
    pub(crate) fn code(&self) -> &str {
        &self.body.code
    }

    pub(crate) fn not_found(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409: the key is held, by `holder` when known.
    pub(crate) fn held(key: &str, holder: Option<LockInfo>) -> Self {
        let mut e = Self::new(
            StatusCode::CONFLICT,
            "held",
            match &holder {
                Some(h) => format!(
                    "lock {} is held by {} (token {})",
                    fencelock_core::shorten(key),
                    h.owner,
                    h.token
                ),
                None => format!("lock {} is held", fencelock_core::shorten(key)),
            },
        );
        e.body.holder = holder;
        e
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        // The code is `Error::code`'s, which the CLI's `--json` errors
        // share; only the status is decided here.
        let code = e.code();
        match &e {
            Error::Timeout { key, .. } => return ApiError::held(key.as_str(), None),
            Error::Stale { current, .. } => {
                let mut out = ApiError::new(StatusCode::CONFLICT, code, &e);
                out.body.current = Some(current.get());
                return out;
            }
            _ => {}
        }
        let status = match code {
            "held" | "not_held" | "stale" | "tokens_exhausted" => StatusCode::CONFLICT,
            "invalid_key" | "invalid_owner" | "invalid_ttl" | "invalid_token" | "bad_request"
            | "unsupported" => StatusCode::BAD_REQUEST,
            "unavailable" | "timeout" => StatusCode::SERVICE_UNAVAILABLE,
            // `unauthorized` from the library is the backend refusing the
            // service's own credentials: the service is misconfigured, the
            // caller's token is not at fault (that is a 401).
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(error = %e, "request failed on the backend");
        }
        ApiError::new(status, code, e)
    }
}

/// What a client told to go elsewhere by a replica that shuts down should
/// wait before it asks the same address again: about what a balancer
/// needs to notice the replica is gone (`deploy/haproxy.cfg` checks every
/// 300 ms, two failures take it out).
const RETRY_AFTER_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// The `retry_after_ms` of an answer on a spare connection: long polls and
/// streams free their connections at their own pace, so a short pause.
const RETRY_AFTER_OVERLOAD: std::time::Duration = std::time::Duration::from_millis(250);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let Some(after) = self.retry_after else {
            return (self.status, Json(*self.body)).into_response();
        };
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        let mut body = serde_json::to_value(&*self.body).unwrap_or_default();
        if let Some(fields) = body.as_object_mut() {
            fields.insert("retry_after_ms".to_owned(), ms.into());
        }
        (
            self.status,
            [(
                axum::http::header::RETRY_AFTER,
                after.as_secs().max(1).to_string(),
            )],
            Json(body),
        )
            .into_response()
    }
}
