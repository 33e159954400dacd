//! One error type for the whole library.
//!
//! Backends never return their driver's error directly: each backend maps its
//! driver errors in one place into a [`BackendError`], which records whether
//! retrying could help. That classification is what the renewal task and the
//! waiting loop act on.

use std::{error::Error as StdError, fmt, time::Duration};

use crate::types::{FencingToken, LeaseId, LockKey, Owner};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many bytes of an input a message quotes ([`shorten`]).
pub const SHORTEN_TO: usize = 64;

/// `input` as an error message should quote it: whole up to
/// [`SHORTEN_TO`] bytes, else its first 64 bytes (cut at a character
/// boundary) and its length, `aaaa…(10000 bytes)`. A 10,000-byte key or
/// duration is not repeated whole in every log line and error body; the
/// Go module shortens the same way.
pub fn shorten(input: &str) -> std::borrow::Cow<'_, str> {
    shorten_to(input, SHORTEN_TO)
}

/// [`shorten`] with another limit (e.g. a whole message).
pub fn shorten_to(input: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if input.len() <= limit {
        return input.into();
    }
    let mut cut = limit;
    while !input.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…({} bytes)", &input[..cut], input.len()).into()
}

/// Why a guard stopped holding its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The backend answered that this (owner, token) no longer holds the key:
    /// the lease expired and was taken over, or someone force-released it.
    Refused,
    /// No renewal was confirmed before the conservative local deadline (I5), so
    /// the lease may end on the backend at any moment.
    Deadline,
    /// The client was closed ([`crate::LockClient::close`]), which released
    /// every lease it held.
    Closed,
}

impl LossReason {
    /// A short label, also used as the `reason` label of the loss metric.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Refused => "refused",
            LossReason::Deadline => "deadline",
            LossReason::Closed => "closed",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::Refused => "the backend no longer has this lease",
            LossReason::Deadline => "no renewal was confirmed before the local deadline",
            LossReason::Closed => "the client was closed and released it",
        })
    }
}

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not acquired before the wait deadline.
    #[error("lock {key} was not acquired within {}", humantime::format_duration(*.waited))]
    Timeout {
        /// The contended key.
        key: LockKey,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The guard's lease is gone (or may be gone): stop acting on its behalf.
    #[error("lock {key} (token {token}) was lost: {reason}")]
    LockLost {
        /// The key.
        key: LockKey,
        /// The token the lost guard held.
        token: FencingToken,
        /// Why.
        reason: LossReason,
    },
    /// A guard (or a handle of it) asked to act after its holder released
    /// it, let it drop or detached it: it holds nothing any more. Not a
    /// loss: the lease ended because its holder said so.
    #[error("lock {key} (token {token}) is no longer held by this guard: it was {}", if *.detached { "detached" } else { "released" })]
    Released {
        /// The key.
        key: LockKey,
        /// The token the guard held.
        token: FencingToken,
        /// Whether it was detached (handed over) rather than released.
        detached: bool,
    },
    /// Renew or release of a lease this (owner, token) does not hold.
    #[error("lock {key} is not held by owner {owner} with token {token}")]
    NotHeld {
        /// The key.
        key: LockKey,
        /// The owner that asked.
        owner: Owner,
        /// The token that was presented.
        token: FencingToken,
    },
    /// A fence refused a token lower than one it has already admitted (I7).
    #[error("stale fencing token {presented} for resource {resource}: token {current} has been admitted")]
    Stale {
        /// The fenced resource.
        resource: String,
        /// The token that was refused.
        presented: FencingToken,
        /// The highest token the fence has admitted.
        current: FencingToken,
    },
    /// The key (or fenced resource name) breaks the naming rule.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The owner breaks the naming rule.
    #[error("invalid owner: {0}")]
    InvalidOwner(String),
    /// The TTL is zero, negative, unparsable or absurdly long.
    #[error("invalid TTL: {0}")]
    InvalidTtl(String),
    /// A fencing token that is not an unsigned 64-bit integer.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// Any other bad argument (a wait, a renewal period, lock data…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A connection URL that cannot be used. The message never contains a password.
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    /// The backend cannot do this (e.g. a scheme whose cargo feature is off,
    /// or an operation its [`crate::Capabilities`] do not claim).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A backend call got no answer within the client's own bound (the
    /// client's operation timeout, or the part of a lease a renewal may
    /// take). Nothing is known of its outcome: the request may or may not
    /// have taken effect.
    #[error("{operation} got no answer within {}", humantime::format_duration(*.after))]
    OperationTimeout {
        /// What was asked: `acquire`, `renew`, `release`, …
        operation: &'static str,
        /// How long the client waited.
        after: Duration,
    },
    /// A semaphore was asked for with a number of permits other than the
    /// one its live permits were taken with (see `docs/semaphore.md`): a
    /// semaphore's size never changes silently.
    #[error("semaphore {name} has {existing} permits, not {requested}")]
    PermitsMismatch {
        /// The semaphore.
        name: String,
        /// The number of permits a live permit was taken with.
        existing: u32,
        /// The number of permits asked for.
        requested: u32,
    },
    /// The key's token counter reached [`FencingToken::MAX`]: no token is
    /// left above the last one, so the key cannot be granted again (I2
    /// forbids repeating a token). Floors are capped at
    /// [`FencingToken::MAX_FLOOR`], so only 2^52 grants after the highest
    /// floor get here.
    #[error(
        "lock {key} has no fencing token left: its counter reached {}",
        FencingToken::MAX
    )]
    TokensExhausted {
        /// The key that could not be granted.
        key: LockKey,
    },
    /// The client was closed: it takes no new locks.
    #[error("the lock client was closed")]
    ClientClosed,
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl Error {
    /// How this failure is classified: what the renewal task, the waiting
    /// loop and the CLI's exit codes act on.
    pub fn status(&self) -> ErrorStatus {
        match self {
            Error::Timeout { .. } | Error::OperationTimeout { .. } => ErrorStatus::Timeout,
            Error::Backend(e) => e.status(),
            _ => ErrorStatus::Permanent,
        }
    }

    /// Whether trying again later could succeed: a timeout, or a backend error
    /// its backend classified as transient (connection lost, busy, failover).
    pub fn is_transient(&self) -> bool {
        self.status() != ErrorStatus::Permanent
    }

    /// [`Error::NotHeld`] for `lease`: the one way every backend says that
    /// a renewal or release found another lease, or none.
    pub fn not_held(lease: &LeaseId) -> Self {
        Error::NotHeld {
            key: lease.key.clone(),
            owner: lease.owner.clone(),
            token: lease.token,
        }
    }

    /// The stable, machine-readable name of this failure: the `code` of the
    /// REST API's error bodies (`docs/http.md`) and of the CLI's `--json`
    /// errors, so that both name a failure alike. One of `held` (the wait
    /// ended while another held the key), `not_held` (the lease is gone:
    /// not held, or lost), `stale`, `tokens_exhausted`, `invalid_key`,
    /// `invalid_owner`, `invalid_ttl`, `invalid_token`, `bad_request`,
    /// `unsupported`, `timeout` (no answer in time), `unavailable` (a
    /// transient failure, or a closed client), `unauthorized` (the backend
    /// refused the URL's credentials) and `internal` (any other failure of
    /// the backend).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "held",
            Error::NotHeld { .. } | Error::LockLost { .. } | Error::Released { .. } => "not_held",
            Error::TokensExhausted { .. } => "tokens_exhausted",
            Error::Stale { .. } => "stale",
            Error::InvalidKey(_) => "invalid_key",
            Error::InvalidOwner(_) => "invalid_owner",
            Error::InvalidTtl(_) => "invalid_ttl",
            Error::InvalidToken(_) => "invalid_token",
            Error::InvalidArgument(_) | Error::InvalidUrl(_) | Error::PermitsMismatch { .. } => {
                "bad_request"
            }
            Error::Unsupported(_) => "unsupported",
            Error::ClientClosed => "unavailable",
            Error::OperationTimeout { .. } => "timeout",
            Error::Backend(b) if b.is_unauthorized() => "unauthorized",
            Error::Backend(b) => match b.status() {
                ErrorStatus::Transient => "unavailable",
                ErrorStatus::Timeout => "timeout",
                ErrorStatus::Permanent => "internal",
            },
        }
    }

    /// A copy of this failure for another caller of the same failed
    /// request (each lease of a failed batch renewal), since errors cannot
    /// be cloned: a backend error is [`BackendError::duplicate`]d; any
    /// other becomes an error of `backend` with this one's status and text.
    pub fn duplicate(&self, backend: &'static str) -> Error {
        match self {
            Error::Backend(b) => b.duplicate().into(),
            other => BackendError::message(backend, other.status(), other.to_string()).into(),
        }
    }

    /// [`Error::Unsupported`] for an operation `backend` does not offer.
    pub fn unsupported(backend: &str, operation: &str) -> Self {
        Error::Unsupported(format!(
            "the {backend} backend does not support {operation}"
        ))
    }
}

/// How a failure is classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorStatus {
    /// Retrying may succeed: connection refused or reset, server busy or
    /// restarting, too many connections, leader election.
    Transient,
    /// Retrying will not help: bad input, permissions, a broken schema, a
    /// corrupt database, an unsupported operation.
    Permanent,
    /// No answer came in time; the operation may or may not have taken
    /// effect. Retrying may succeed.
    Timeout,
}

impl ErrorStatus {
    /// A short label (`transient`, `permanent`, `timeout`), e.g. for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorStatus::Transient => "transient",
            ErrorStatus::Permanent => "permanent",
            ErrorStatus::Timeout => "timeout",
        }
    }
}

/// A failure inside a backend, classified once by the backend that saw it.
pub struct BackendError {
    backend: &'static str,
    status: ErrorStatus,
    /// The backend refused our credentials (a wrong or missing password,
    /// an unknown user): permanent, and code `unauthorized`.
    unauthorized: bool,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl BackendError {
    /// A failure that may pass: connection refused or reset, server busy or
    /// restarting, leader election.
    pub fn transient(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self::message(backend, ErrorStatus::Transient, message).with_source(source)
    }

    /// No answer within the backend's own time-out (connect or operation):
    /// the outcome is unknown.
    pub fn timeout(backend: &'static str, message: impl Into<String>) -> Self {
        Self::message(backend, ErrorStatus::Timeout, message)
    }

    /// A failure that retrying will not fix: permissions, a broken schema,
    /// a corrupt database.
    pub fn permanent(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self::message(backend, ErrorStatus::Permanent, message).with_source(source)
    }

    /// A failure described by a message alone (e.g. a reply of the wrong shape).
    pub fn message(backend: &'static str, status: ErrorStatus, message: impl Into<String>) -> Self {
        Self {
            backend,
            status,
            unauthorized: false,
            message: message.into(),
            source: None,
        }
    }

    /// The backend refused the credentials of the URL (a wrong or missing
    /// password, an unknown user, an ACL): permanent, since retrying with
    /// the same credentials cannot succeed, and reported with the code
    /// `unauthorized` rather than `internal`.
    pub fn unauthorized(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        let mut e = Self::permanent(backend, message, source);
        e.unauthorized = true;
        e
    }

    /// Whether the backend refused our credentials ([`Self::unauthorized`]).
    pub fn is_unauthorized(&self) -> bool {
        self.unauthorized
    }

    /// Attaches the underlying error.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// How this failure is classified.
    pub fn status(&self) -> ErrorStatus {
        self.status
    }

    /// The same failure again, for another caller of one failed request
    /// (every lease of a failed batch renewal): the same backend, status
    /// and message, with the source kept as its text, since sources cannot
    /// be cloned. Rebuilding it from its `Display` instead would repeat the
    /// "BACKEND backend:" prefix.
    pub fn duplicate(&self) -> Self {
        Self {
            backend: self.backend,
            status: self.status,
            unauthorized: self.unauthorized,
            message: self.message.clone(),
            source: self
                .source
                .as_ref()
                .map(|s| Box::<dyn StdError + Send + Sync>::from(s.to_string())),
        }
    }

    /// Whether retrying could help (transient or timed out).
    pub fn is_transient(&self) -> bool {
        self.status != ErrorStatus::Permanent
    }

    /// The backend's name (`sqlite`, `postgres`, …).
    pub fn backend(&self) -> &'static str {
        self.backend
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("backend", &self.backend)
            .field("status", &self.status)
            .field("unauthorized", &self.unauthorized)
            .field("message", &self.message)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} backend: {}", self.backend, self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_inputs_are_shortened() {
        assert_eq!(shorten("short"), "short");
        let long = "é".repeat(5000);
        let short = shorten(&long);
        assert!(short.ends_with("…(10000 bytes)"), "{short}");
        assert!(short.len() < 100, "{short}");
    }

    #[test]
    fn an_authentication_failure_has_its_own_code() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "WRONGPASS");
        let e = Error::from(BackendError::unauthorized("redis", "AUTH failed", io));
        assert_eq!(e.code(), "unauthorized");
        assert!(!e.is_transient());
        let Error::Backend(b) = &e else { panic!() };
        assert_eq!(Error::from(b.duplicate()).code(), "unauthorized");
    }

    #[test]
    fn a_duplicate_names_its_backend_once() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let e = BackendError::transient("redis", "renew script failed", io);
        let copy = e.duplicate();
        assert_eq!(copy.to_string(), e.to_string());
        assert_eq!(
            copy.to_string(),
            "redis backend: renew script failed: broken pipe"
        );
        assert_eq!(copy.status(), ErrorStatus::Transient);
        assert_eq!(Error::from(copy).code(), "unavailable");
    }
}
