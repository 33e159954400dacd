//! The one place where `etcd-client` errors become fencelock errors.

use etcd_client::Error as EtcdError;
use fencelock_core::{BackendError, Error};
use tonic::Code;

pub(crate) const NAME: &str = "etcd";

/// Whether the error says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("requested lease not found")
        }
        // The keep-alive stream reports an unknown lease this way.
        EtcdError::LeaseKeepAliveError(m) => m.contains("not found"),
        _ => false,
    }
}

/// Classifies a driver error: lost connections, missing or changing
/// leaders, timeouts and overload are transient; the rest permanent.
pub(crate) fn map(context: &str, e: EtcdError) -> Error {
    let transient = match &e {
        EtcdError::IoError(_) | EtcdError::TransportError(_) => true,
        EtcdError::LeaseKeepAliveError(_) | EtcdError::WatchError(_) => true,
        EtcdError::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled => true,
            Code::Unknown | Code::Internal => {
                let m = s.message();
                m.contains("leader")
                    || m.contains("timed out")
                    || m.contains("timeout")
                    || m.contains("too many requests")
                    || m.contains("connection")
                    || m.contains("transport")
            }
            _ => false,
        },
        _ => false,
    };
    let message = format!("{context} failed");
    if transient {
        BackendError::transient(NAME, message, e).into()
    } else {
        BackendError::permanent(NAME, message, e).into()
    }
}

/// A stored value this crate never writes: permanent.
pub(crate) fn bad_value(what: impl Into<String>) -> Error {
    BackendError::message(NAME, false, what).into()
}
