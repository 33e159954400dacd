//! Binding, serving (plain or TLS), the bounds on connections and clean
//! shutdown.
//!
//! The accept loop and the HTTP/1.1 connections are the service's own
//! (hyper's connection builder under the axum router) rather than
//! `axum::serve` and `axum_server`: neither closes a connection that sits
//! idle or sends its request head slowly, nor caps how many are open, and
//! either lets a flood of idle sockets use up the process's files until
//! `/healthz` cannot be answered (`docs/decisions.md`).

use std::{
    convert::Infallible, future::Future, io, net::SocketAddr, path::PathBuf, sync::Arc,
    time::Duration,
};

use axum::{body::Body, response::IntoResponse, Router};
use fencelock_core::CancellationToken;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    task::{JoinHandle, JoinSet},
};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::{
    conns::{Conn, Registry, Timeouts, Tracked, Watched},
    error::ApiError,
    router, Service,
};

/// How long the accept loop pauses after a failed accept (out of files,
/// most likely), rather than spinning on the error.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The bounds on a server's connections (`docs/http.md`, "Connections and
/// their limits").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a request's head: from the
    /// connection's opening (TLS handshake included) for the first, from
    /// its first byte for the next ones. Past it the connection is closed.
    pub header_read_timeout: Duration,
    /// How long a connection may sit between two requests. A request in
    /// flight (a long poll, an event stream) is never idle.
    pub idle_timeout: Duration,
    /// Most connections open at once (`None`: three quarters of the
    /// process's file limit, [`default_max_connections`]). A new one over
    /// the cap closes the connection idle longest. When every one is busy
    /// with a request, the new one takes one of 16 spares kept beyond the
    /// cap, which answers `/healthz` and refuses anything else with 503
    /// `unavailable` and `retry_after_ms`, then closes; with the spares
    /// taken too, it is closed.
    pub max_connections: Option<usize>,
    /// How long a shutdown waits for the answers in flight (long polls are
    /// answered at once) before it closes their connections.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: None,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// The connection cap when none is configured: the process's file limit
/// (`RLIMIT_NOFILE`, soft) less a quarter, at least 64, kept for the
/// backend's sockets, the change feeds and files.
pub fn default_max_connections() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    let soft = usize::try_from(soft).unwrap_or(usize::MAX).min(1 << 20);
    soft.saturating_sub((soft / 4).max(64)).max(1)
}

/// Raises the process's soft file limit to its hard limit (at most 2^20),
/// as a server that holds a socket per client wants; returns the soft limit
/// now in force.
pub fn raise_file_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    let target = hard.min(1 << 20);
    if soft < target {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard).map_err(io::Error::from)?;
        return Ok(target);
    }
    Ok(soft)
}

/// A bound lock service, ready to [`run`](Server::run) or
/// [`spawn`](Server::spawn).
#[derive(Debug)]
pub struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    service: Service,
    tls: Option<(PathBuf, PathBuf)>,
    limits: Limits,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port: read it with
    /// [`local_addr`](Server::local_addr)).
    pub async fn bind(addr: SocketAddr, service: Service) -> io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?.into_std()?;
        let addr = listener.local_addr()?;
        Ok(Self {
            listener,
            addr,
            service,
            tls: None,
            limits: Limits::default(),
        })
    }

    /// Serves HTTPS with the PEM certificate chain and private key in these
    /// files (read when the server starts).
    pub fn tls(mut self, cert: PathBuf, key: PathBuf) -> Self {
        self.tls = Some((cert, key));
        self
    }

    /// The bounds on connections (default: [`Limits::default`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The address bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then stops taking connections,
    /// answers the long polls (503 `unavailable`, with `retry_after_ms`),
    /// ends the event streams, and waits for the other requests in flight
    /// at most [`Limits::drain_timeout`].
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let tls = match &self.tls {
            Some((cert, key)) => Some(TlsAcceptor::from(Arc::new(tls_config(cert, key)?))),
            None => None,
        };
        let app = router(self.service.clone());
        let limits = self.limits;
        let max = limits
            .max_connections
            .unwrap_or_else(default_max_connections);
        let timeouts = Timeouts {
            header_read: limits.header_read_timeout,
            idle: limits.idle_timeout,
        };
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let registry = Arc::new(Registry::default());
        let draining = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            while tasks.try_join_next().is_some() {}
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(error = %e, open = registry.len(), "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let Some(conn) = registry.open(max) else {
                tracing::debug!(max, "every connection and spare is busy; closing a new one");
                continue;
            };
            // Answers and events are small writes: Nagle's algorithm
            // would hold one back until the peer acknowledged the last
            // (a delayed ACK away) whenever two follow each other.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            tasks.spawn(connection(
                tcp,
                conn,
                Arc::clone(&registry),
                tls.clone(),
                app.clone(),
                timeouts,
                draining.clone(),
            ));
        }
        // Closed first, so that a client told to go elsewhere below finds
        // this replica refusing, and moves on.
        drop(listener);
        // Long polls answer, event streams end.
        self.service.shutdown();
        draining.cancel();
        let drained = tokio::time::timeout(limits.drain_timeout, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                connections = tasks.len(),
                "closing connections whose requests outlived the drain timeout"
            );
            tasks.shutdown().await;
        }
        Ok(())
    }

    /// Serves in a task of its own until the returned handle is dropped or
    /// [`shut down`](ServerHandle::shutdown).
    pub fn spawn(self) -> ServerHandle {
        let addr = self.addr;
        let stop = CancellationToken::new();
        let cancelled = stop.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = self.run(async move { cancelled.cancelled().await }).await {
                tracing::error!(error = %e, "the lock service stopped");
            }
        });
        ServerHandle {
            addr,
            stop: stop.drop_guard(),
            task,
        }
    }
}

/// Removes a connection from the registry however its task ends.
struct Deregister(Arc<Registry>, Arc<Conn>);

impl Drop for Deregister {
    fn drop(&mut self) {
        self.0.close(&self.1);
    }
}

/// One connection, from its TLS handshake to its close.
async fn connection(
    tcp: TcpStream,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    tls: Option<TlsAcceptor>,
    app: Router,
    timeouts: Timeouts,
    draining: CancellationToken,
) {
    let _registered = Deregister(registry, Arc::clone(&conn));
    let io = Watched {
        inner: tcp,
        conn: Arc::clone(&conn),
    };
    let Some(acceptor) = tls else {
        return http(io, conn, app, timeouts, draining).await;
    };
    // The handshake is part of the first request's head: the same bound.
    let Some(deadline) = conn.deadline(timeouts) else {
        return;
    };
    let stream = tokio::select! {
        handshake = tokio::time::timeout_at(deadline, acceptor.accept(io)) => match handshake {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake took longer than the header-read timeout");
                return;
            }
        },
        () = conn.evicted.cancelled() => return,
        () = draining.cancelled() => return,
    };
    http(stream, conn, app, timeouts, draining).await;
}

/// Serves HTTP/1.1 on `io` until the client closes, a timeout of
/// [`Limits`] passes, the registry needs the room or the drain ends.
async fn http<I>(
    io: I,
    conn: Arc<Conn>,
    app: Router,
    timeouts: Timeouts,
    draining: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = Arc::clone(&conn);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let busy = served.begin();
        let app = app.clone();
        // A spare connection (see `conns`) serves the health check only.
        let refused = served.spare && request.uri().path() != "/healthz";
        async move {
            let response = if refused {
                ApiError::overloaded().into_response()
            } else {
                match app.oneshot(request.map(Body::new)).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            };
            Ok::<_, Infallible>(response.map(|inner| Tracked { inner, _busy: busy }))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(!conn.spare)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let deadline = conn.deadline(timeouts);
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = conn.changed.notified() => {}
            () = sleep_until(deadline) => {
                // The deadline may have moved while the timer ran.
                if conn.deadline(timeouts).is_some_and(|d| d <= tokio::time::Instant::now()) {
                    tracing::debug!("closing an idle or slow connection");
                    return;
                }
            }
            () = conn.evicted.cancelled() => {
                tracing::debug!("closing the longest idle connection to make room");
                return;
            }
            () = draining.cancelled(), if !closing => {
                closing = true;
                // Idle connections close now, busy ones after their answer.
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A running [`Server`]; dropping it shuts the server down.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    /// Dropping it cancels the server's shutdown token.
    stop: tokio_util::sync::DropGuard,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The address served.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shuts down and waits until requests in flight have been answered.
    pub async fn shutdown(self) {
        let ServerHandle { stop, task, .. } = self;
        drop(stop);
        // A panic in the server task has been logged by the runtime already.
        let _ = task.await;
    }
}

fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> io::Result<rustls::ServerConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let invalid = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| invalid("cannot read certificate", cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("bad certificate", cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| invalid("cannot read private key", key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("TLS setup for", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| invalid("certificate and key do not fit:", cert, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
