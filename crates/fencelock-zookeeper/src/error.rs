//! The one place where `zookeeper-client` errors become fencelock errors.

use std::{future::Future, time::Duration};

use fencelock_core::{BackendError, Error, ErrorStatus};
use zookeeper_client::Error as ZkError;

pub(crate) const NAME: &str = "zookeeper";

/// Classifies a client error: lost connections and socket errors, expired
/// or moved sessions, throttling and the client's own time-outs are
/// transient (the next call
/// may reach a server, on a new session if need be); the rest permanent.
pub(crate) fn map(context: &str, e: ZkError) -> Error {
    let message = format!("{context} failed");
    match e {
        ZkError::Timeout => {
            BackendError::timeout(NAME, format!("{context} got no answer in time")).into()
        }
        ZkError::ConnectionLoss
        | ZkError::NoHosts
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::ClientClosed
        | ZkError::Throttled
        | ZkError::NotReadOnly
        // The client reports socket errors (reset, refused) this way.
        | ZkError::Custom(_) => BackendError::transient(NAME, message, e).into(),
        _ => BackendError::permanent(NAME, message, e).into(),
    }
}

/// A stored value this crate never writes: permanent.
pub(crate) fn bad_value(what: impl Into<String>) -> Error {
    BackendError::message(NAME, ErrorStatus::Permanent, what).into()
}

/// `fut`, or [`ZkError::Timeout`] once `timeout` has passed. While the
/// client reconnects, a request waits for the new connection; the caller
/// must hear back within its own time-out (the request may still take
/// effect, which is why it is a time-out and not a refusal).
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, ZkError>>,
) -> Result<T, ZkError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(ZkError::Timeout))
}
