//! Every refusal as an HTTP status and an [`ErrorBody`]: a one-line reason
//! and a stable code.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use fencelock_core::{Error, ErrorStatus, LockInfo};
use fencelock_http::wire::ErrorBody;

/// A refusal.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    // Boxed: handlers pass refusals up through `?` on every path.
    body: Box<ErrorBody>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Self {
        // One line, whatever the source said.
        let error = message
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Self {
            status,
            body: Box::new(ErrorBody {
                error,
                code: code.to_owned(),
                holder: None,
                current: None,
            }),
        }
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
                Some(h) => format!("lock {key} is held by {} (token {})", h.owner, h.token),
                None => format!("lock {key} is held"),
            },
        );
        e.body.holder = holder;
        e
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::Timeout { key, .. } => return ApiError::held(key.as_str(), None),
            Error::NotHeld { .. } | Error::LockLost { .. } => (StatusCode::CONFLICT, "not_held"),
            Error::TokensExhausted { .. } => (StatusCode::CONFLICT, "tokens_exhausted"),
            Error::Stale { current, .. } => {
                let mut out = ApiError::new(StatusCode::CONFLICT, "stale", &e);
                out.body.current = Some(current.get());
                return out;
            }
            Error::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid_key"),
            Error::InvalidOwner(_) => (StatusCode::BAD_REQUEST, "invalid_owner"),
            Error::InvalidTtl(_) => (StatusCode::BAD_REQUEST, "invalid_ttl"),
            Error::InvalidToken(_) => (StatusCode::BAD_REQUEST, "invalid_token"),
            Error::InvalidArgument(_) | Error::InvalidUrl(_) | Error::PermitsMismatch { .. } => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            Error::Unsupported(_) => (StatusCode::BAD_REQUEST, "unsupported"),
            Error::ClientClosed => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::OperationTimeout { .. } => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            Error::Backend(b) => match b.status() {
                ErrorStatus::Transient => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                ErrorStatus::Timeout => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            },
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() {
            tracing::warn!(error = %e, "request failed on the backend");
        }
        ApiError::new(status, code, e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(*self.body)).into_response()
    }
}
