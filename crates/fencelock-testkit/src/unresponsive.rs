//! A server that accepts connections but never answers (a [`ProxiedUrl`]
//! swallowing everything, both ways): a backend's connect and per-operation
//! timeout must turn that into a transient error within the timeout, never a
//! hang. One check for every backend that has a `timeout` URL option.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};

use crate::{proxy::ProxiedUrl, servers::url_factory::Opener, TestResult};

/// What a loaded 2-core test machine may add to a timeout; far below the
/// tens of seconds a hang lasts.
pub const SLACK: Duration = Duration::from_secs(3);

/// Runs `op` and checks that it failed with a transient error within `bound`.
async fn fails_within<T: std::fmt::Debug>(
    what: &str,
    bound: Duration,
    op: impl Future<Output = fencelock_core::Result<T>>,
) -> TestResult {
    let started = Instant::now();
    // The outer limit only keeps a hang from stalling the test run.
    let outcome = tokio::time::timeout(bound + Duration::from_secs(60), op).await;
    let took = started.elapsed();
    match outcome {
        Ok(Err(e)) if e.is_transient() => {}
        Ok(other) => {
            return Err(format!("{what}: expected a transient error, got {other:?}").into())
        }
        Err(_) => return Err(format!("{what}: still hanging after {took:?}").into()),
    }
    if took > bound {
        return Err(format!("{what} failed only after {took:?}, more than {bound:?}").into());
    }
    eprintln!("{what} failed after {took:?}");
    Ok(())
}

/// `url` (the server's, without query options) opened by `open` with
/// `timeout=…` set to `timeout`:
///
/// - through a proxy that swallows everything from the start, opening the
///   backend fails within `timeout + SLACK`: a backend whose client
///   connects lazily must prove at open that the server answers, or a
///   waiter's first request would find out later, after its wait began;
/// - connected while the server answers, then cut off: `renew`,
///   `try_acquire`, `inspect`, `release`, `list` and `subscribe` each fail
///   within `timeout + SLACK`.
pub async fn timeouts_are_honoured(
    url: &str,
    timeout: Duration,
    open: Opener<dyn Backend>,
) -> TestResult {
    let with_timeout =
        |proxied: &ProxiedUrl| format!("{}?timeout={}ms", proxied.url(), timeout.as_millis());
    let bound = timeout + SLACK;
    let (key, owner) = (LockKey::new("unresponsive")?, Owner::new("holder")?);

    let silent = ProxiedUrl::start(url).await?;
    silent.partition();
    let silent_url = with_timeout(&silent);
    fails_within("open", bound, open(silent_url)).await?;

    let proxied = ProxiedUrl::start(url).await?;
    let backend = open(with_timeout(&proxied)).await?;
    let request = AcquireRequest {
        key: key.clone(),
        owner: owner.clone(),
        ttl: Duration::from_secs(30),
        kind: None,
        data: None,
    };
    let token = match backend.try_acquire(&request).await? {
        Acquire::Granted(g) => g.token,
        held => return Err(format!("{key} is not free: {held:?}").into()),
    };
    proxied.partition();
    let ttl = request.ttl;
    fails_within("renew", bound, backend.renew(&key, &owner, token, ttl)).await?;
    fails_within("try_acquire", bound, backend.try_acquire(&request)).await?;
    fails_within("inspect", bound, backend.inspect(&key)).await?;
    fails_within("release", bound, backend.release(&key, &owner, token)).await?;
    fails_within("list", bound, backend.list(None)).await?;
    fails_within("subscribe", bound, async {
        backend.subscribe(&key).await.map(|s| s.is_some())
    })
    .await
}
