//! The one place where `redis` errors become fencelock errors.

use fencelock_core::{BackendError, Error};
use redis::{ErrorKind, RedisError};

pub(crate) const NAME: &str = "redis";

/// Classifies a driver error: anything a reconnect, a failover or waiting
/// out a busy server can fix is transient; the rest (auth, wrong types,
/// script bugs, bad config) is permanent.
pub fn map(context: &str, e: RedisError) -> Error {
    if e.is_timeout() {
        // The `timeout` option fired (ours or the driver's response
        // timeout): the command may or may not have run.
        return BackendError::timeout(NAME, format!("{context} got no answer in time"))
            .with_source(e)
            .into();
    }
    let transient = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::BusyLoadingError
                | ErrorKind::MasterDown
                | ErrorKind::ReadOnly
                | ErrorKind::Moved
                | ErrorKind::Ask
                | ErrorKind::ClusterConnectionNotFound
                // The Sentinels name no master that answers: a failover
                // under way (or a wrong name, which the caller's bound ends).
                | ErrorKind::MasterNameNotFoundBySentinel
        )
        || matches!(
            e.code(),
            Some("BUSY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN")
        );
    let message = format!("{context} failed");
    // A wrong password (WRONGPASS, or the driver's own check of the AUTH
    // reply) or none where one is needed (NOAUTH): the same credentials
    // will be refused again, so this is said at once, as `unauthorized`.
    if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
    {
        return BackendError::unauthorized(
            NAME,
            format!("{context} failed: the server refused the URL's credentials"),
            e,
        )
        .into();
    }
    if transient {
        BackendError::transient(NAME, message, e).into()
    } else {
        BackendError::permanent(NAME, message, e).into()
    }
}

/// A reply whose shape the scripts never produce: a bug or a foreign value
/// under our key prefix, so retrying will not help.
pub fn bad_reply(what: impl Into<String>) -> Error {
    BackendError::message(NAME, fencelock_core::ErrorStatus::Permanent, what).into()
}
