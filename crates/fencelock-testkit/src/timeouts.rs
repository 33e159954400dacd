//! Time limits of the SQL backends (their `connect_timeout` and
//! `op_timeout` URL options), checked against real servers: a server that
//! accepts connections but never answers, and a statement that the server
//! keeps waiting on a row lock. Each backend's tests call these with its own
//! URL and a way to hold a row lock.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use fencelock_core::{Acquire, AcquireRequest, Backend, Error, LockKey, Owner};
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;

use crate::{cases::ensure, TestResult};

/// Generous room for scheduling on a loaded machine; the limits checked
/// are bounds, never speeds.
pub const SLACK: Duration = Duration::from_secs(5);

/// A loopback listener that accepts every connection and never sends a
/// byte, for as long as it lives.
pub struct SilentServer {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl SilentServer {
    /// Starts listening on a free loopback port.
    pub async fn start() -> TestResult<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        Ok(Self { port, task })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ensure_transient(what: &str, e: &Error) -> TestResult {
    match e {
        Error::Backend(b) if b.is_transient() => Ok(()),
        other => Err(format!("{what}: {other:?}, expected a transient backend error").into()),
    }
}

/// `open(url)` for a server that never answers fails with a transient
/// backend error within `connect_timeout` (plus [`SLACK`]). `url_for(port)`
/// builds the backend's URL with `?connect_timeout=` set to
/// `connect_timeout`.
pub async fn connecting_to_a_silent_server_fails_in_time<T, Fut>(
    connect_timeout: Duration,
    url_for: impl FnOnce(u16) -> String,
    open: impl FnOnce(String) -> Fut,
) -> TestResult
where
    Fut: Future<Output = fencelock_core::Result<T>>,
{
    let silent = SilentServer::start().await?;
    let started = Instant::now();
    let opened = tokio::time::timeout(connect_timeout + SLACK, open(url_for(silent.port()))).await;
    let took = started.elapsed();
    match opened {
        Err(_) => Err(format!("connecting still hung after {took:?}").into()),
        Ok(Ok(_)) => Err("connected to a server that never answers".into()),
        Ok(Err(e)) => ensure_transient("connecting to a silent server", &e),
    }
}

/// Holds a row lock on one lease (given by key) in a transaction of its
/// own until the returned value is dropped.
pub type HoldRow = Box<dyn FnOnce(String) -> BoxFuture<'static, TestResult<Box<dyn Send>>> + Send>;

/// A renewal that the server keeps waiting (`hold` holds its row lock)
/// fails with a transient error within `op_timeout` (plus [`SLACK`]), and
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
        .try_acquire(&AcquireRequest {
            key: key.clone(),
            owner: owner.clone(),
            ttl: Duration::from_secs(120),
            kind: None,
            data: None,
        })
        .await?;
    let Acquire::Granted(grant) = granted else {
        return Err(format!("a free key was refused: {granted:?}").into());
    };
    let held = hold(key.as_str().to_owned()).await?;
    let started = Instant::now();
    let renewed = tokio::time::timeout(
        op_timeout + SLACK,
        backend.renew(&key, &owner, grant.token, Duration::from_secs(120)),
    )
    .await;
    let took = started.elapsed();
    match renewed {
        Err(_) => return Err(format!("a blocked renewal still hung after {took:?}").into()),
        Ok(Ok(g)) => return Err(format!("a renewal went through a row lock: {g:?}").into()),
        Ok(Err(e)) => ensure_transient("a blocked renewal", &e)?,
    }
    let seen = tokio::time::timeout(op_timeout + SLACK, backend.inspect(&key)).await;
    drop(held);
    let seen = seen.map_err(|_| "inspect hung after a renewal timed out")??;
    ensure!(
        seen.as_ref().map(|l| l.token) == Some(grant.token),
        "inspect after a timed-out renewal: {seen:?}"
    );
    backend.release(&key, &owner, grant.token).await?;
    Ok(())
}
