//! The bound on one backend call: every call the client, its guards, the
//! renewer and the polled watches make is bounded, so that a backend that
//! stops answering costs an `OperationTimeout`, never a hang.

use std::{future::Future, time::Duration};

use crate::error::{Error, Result};

/// `call` bounded by the operation timeout.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    operation: &'static str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => answer,
        Err(_) => Err(Error::OperationTimeout {
            operation,
            after: timeout,
        }),
    }
}
