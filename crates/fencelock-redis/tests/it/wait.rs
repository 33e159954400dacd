//! The optional `WAIT` after acquire: on a server without replicas, asking
//! for one replica makes the acquire fail transiently and leaves no lease.
//!
//! Time: no verdict here depends on elapsed time: with no replica the
//! `WAIT` comes back short whatever its 20 ms timeout.

use std::time::Duration;

use fencelock_core::{AcquireRequest, Backend, LockKey, Owner};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, TestResult};

#[tokio::test]
async fn too_few_replicas_fail_transiently_and_leave_no_lease() -> TestResult {
    let server = RedisServer::start()?;
    let url = format!("{}?wait_replicas=1&wait_timeout=20ms", server.url());
    let backend = RedisBackend::connect(&url).await?;
    let key = LockKey::new("wait")?;
    let request = AcquireRequest::new(key.clone(), Owner::new("w")?, Duration::from_secs(30));
    let err = match backend.try_acquire(&request).await {
        Err(e) => e,
        Ok(a) => return Err(format!("acquire without the replica succeeded: {a:?}").into()),
    };
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("replicas"), "{err}");
    assert!(
        backend.inspect(&key).await?.is_none(),
        "the refused grant left a lease"
    );

    let plain = RedisBackend::connect(&server.url()).await?;
    assert!(matches!(
        plain.try_acquire(&request).await?,
        fencelock_core::Acquire::Granted(_)
    ));
    Ok(())
}
