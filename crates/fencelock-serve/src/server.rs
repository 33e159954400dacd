//! Binding, serving (plain or TLS) and clean shutdown.

use std::{future::Future, io, net::SocketAddr, path::PathBuf, sync::Arc};

use axum_server::tls_rustls::RustlsConfig;
use fencelock_core::CancellationToken;
use tokio::task::JoinHandle;

use crate::{router, Service};

/// A bound lock service, ready to [`run`](Server::run) or
/// [`spawn`](Server::spawn).
#[derive(Debug)]
pub struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    service: Service,
    tls: Option<(PathBuf, PathBuf)>,
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
        })
    }

    /// Serves HTTPS with the PEM certificate chain and private key in these
    /// files (read when the server starts).
    pub fn tls(mut self, cert: PathBuf, key: PathBuf) -> Self {
        self.tls = Some((cert, key));
        self
    }

    /// The address bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then stops taking connections,
    /// ends the event streams and waits for requests in flight.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let app = router(self.service.clone());
        let service = self.service.clone();
        let stop = async move {
            shutdown.await;
            // Event streams never end on their own: end them, or a
            // graceful shutdown would wait for every follower.
            service.shutdown();
        };
        match self.tls {
            None => {
                use axum::serve::ListenerExt;
                // Answers and events are small writes: Nagle's algorithm
                // would hold one back until the peer acknowledged the last
                // (a delayed ACK away) whenever two follow each other.
                let listener = tokio::net::TcpListener::from_std(self.listener)?.tap_io(|tcp| {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                });
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
            }
            Some((cert, key)) => {
                let config = RustlsConfig::from_config(Arc::new(tls_config(&cert, &key)?));
                let handle = axum_server::Handle::new();
                let stopper = handle.clone();
                tokio::spawn(async move {
                    stop.await;
                    stopper.graceful_shutdown(None);
                });
                axum_server::from_tcp_rustls(self.listener, config)
                    .handle(handle)
                    .serve(app.into_make_service())
                    .await
            }
        }
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
