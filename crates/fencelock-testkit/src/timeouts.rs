//! Time limits of the backends, checked against real servers: a server
//! that accepts connections but never answers ([`crate::silent`], or a
//! [`ProxiedUrl`] swallowing everything), and a statement that the server
//! keeps waiting on a row lock. A backend's connect and per-operation
//! timeouts must turn each into a transient error within the limit, never a
//! hang. Each backend's tests call these with its own URL and options.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockKey, Owner};
use futures_util::future::BoxFuture;

use crate::{
    cases::ensure, patience::Patience, proxy::ProxiedUrl, servers::url_factory::Opener,
    silent::SilentServer, TestResult,
};

/// What a loaded 2-core test machine may add to a timeout, as the base of
/// a measured budget ([`slack`]); far below the tens of seconds a hang
/// lasts. The limits checked are bounds, never speeds.
pub const SLACK: Duration = Duration::from_secs(5);

/// [`SLACK`] scaled by a budget measured now ([`Patience`]).
pub async fn slack() -> Duration {
    Patience::measure().await.bound(SLACK)
}

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

/// `open(url)` for a server that never answers fails with a transient
/// error within `connect_timeout` (plus [`slack`]). `url_for(port)` builds
/// the backend's URL with its connect timeout set to `connect_timeout`.
pub async fn connecting_to_a_silent_server_fails_in_time<T: std::fmt::Debug, Fut>(
    connect_timeout: Duration,
    url_for: impl FnOnce(u16) -> String,
    open: impl FnOnce(String) -> Fut,
) -> TestResult
where
    Fut: Future<Output = fencelock_core::Result<T>>,
{
    let silent = SilentServer::start()?;
    fails_within(
        "connecting to a silent server",
        connect_timeout + slack().await,
        open(url_for(silent.port())),
    )
    .await
}

/// Holds a row lock on one lease (given by key) in a transaction of its
/// own until the returned value is dropped.
pub type HoldRow = Box<dyn FnOnce(String) -> BoxFuture<'static, TestResult<Box<dyn Send>>> + Send>;

/// A renewal that the server keeps waiting (`hold` holds its row lock)
/// fails with a transient error within `op_timeout` (plus [`slack`]), and
/// the pool is not poisoned by the abandoned statement: while the row is
/// still locked, another operation succeeds on a backend whose pool has a
/// single connection. `backend` must be opened with `pool_max=1` and
/// `op_timeout` set.
pub async fn a_waiting_statement_times_out_and_the_pool_recovers(
    backend: &dyn Backend,
    op_timeout: Duration,
    hold: HoldRow,
) -> TestResult {
    let key = LockKey::new("timeouts:blocked")?;
    let owner = Owner::new("timeouts")?;
    let granted = backend
        .try_acquire(&AcquireRequest::new(
            key.clone(),
            owner.clone(),
            Duration::from_secs(120),
        ))
        .await?;
    let Acquire::Granted(grant) = granted else {
        return Err(format!("a free key was refused: {granted:?}").into());
    };
    let lease = LeaseId::new(key.clone(), owner.clone(), grant.token);
    let held = hold(key.as_str().to_owned()).await?;
    let bound = op_timeout + slack().await;
    fails_within(
        "a blocked renewal",
        bound,
        backend.renew(&lease, Duration::from_secs(120)),
    )
    .await?;
    let seen = tokio::time::timeout(bound, backend.inspect(&key)).await;
    drop(held);
    let seen = seen.map_err(|_| "inspect hung after a renewal timed out")??;
    ensure!(
        seen.as_ref().map(|l| l.token) == Some(grant.token),
        "inspect after a timed-out renewal: {seen:?}"
    );
    backend.release(&lease).await?;
    Ok(())
}

/// `url` (the server's, without query options) opened by `open` with
/// `timeout=…` set to `timeout`:
///
/// - through a proxy that swallows everything from the start, opening the
///   backend fails within `timeout + slack()`: a backend whose client
///   connects lazily must prove at open that the server answers, or a
///   waiter's first request would find out later, after its wait began;
/// - connected while the server answers, then cut off: `renew`,
///   `try_acquire`, `inspect`, `release`, `list` and `subscribe` each fail
///   within `timeout + slack()`.
pub async fn timeouts_are_honoured(
    url: &str,
    timeout: Duration,
    open: Opener<dyn Backend>,
) -> TestResult {
    let with_timeout =
        |proxied: &ProxiedUrl| format!("{}?timeout={}ms", proxied.url(), timeout.as_millis());
    let bound = timeout + slack().await;
    let (key, owner) = (LockKey::new("unresponsive")?, Owner::new("holder")?);

    let silent = ProxiedUrl::start(url).await?;
    silent.partition();
    let silent_url = with_timeout(&silent);
    fails_within("open", bound, open(silent_url)).await?;

    let proxied = ProxiedUrl::start(url).await?;
    let backend = open(with_timeout(&proxied)).await?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
    let token = match backend.try_acquire(&request).await? {
        Acquire::Granted(g) => g.token,
        held => return Err(format!("{key} is not free: {held:?}").into()),
    };
    proxied.partition();
    let ttl = request.ttl;
    let lease = request.lease(token);
    fails_within("renew", bound, backend.renew(&lease, ttl)).await?;
    fails_within("try_acquire", bound, backend.try_acquire(&request)).await?;
    fails_within("inspect", bound, backend.inspect(&key)).await?;
    fails_within("release", bound, backend.release(&lease)).await?;
    fails_within("list", bound, backend.administer()?.list(None)).await?;
    fails_within("subscribe", bound, async {
        backend.subscribe(&key).await.map(|s| s.is_some())
    })
    .await
}
