//! `fencelock serve`: the backend of `--url` as a lock service over HTTP
//! (the `fencelock-serve` crate; API in `docs/http.md`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;
use fencelock::{Error, LockClient};
use fencelock_serve::{Limits, Server, Service, Tokens};

use crate::output::Output;

/// Options of `fencelock serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Read these options from a TOML file (keys as the flags without
    /// `--`, with `_` for `-`: listen, token_file, tls_cert, tls_key,
    /// events_interval, ephemeral, header_read_timeout, idle_timeout,
    /// max_connections, metrics_max_kinds, client_concurrency,
    /// allow_anonymous); a flag given
    /// as well wins. The backend
    /// URL stays --url / FENCELOCK_URL (docs/http.md, "Running it").
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to listen on, `HOST:PORT` with an IP address or a host
    /// name such as `localhost` (its first address); port 0 picks a free
    /// one; the address is printed on stdout [default: 127.0.0.1:7878].
    #[arg(long)]
    pub listen: Option<String>,

    /// Require a bearer token on every route but /healthz: one
    /// `client TOKEN` or `admin TOKEN` a line; only admin tokens may
    /// force-release and clean up (docs/http.md).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Serve a backend whose leases and tokens die with this process
    /// (`mem://`). Without it such a backend is refused: after a restart
    /// its tokens start again at 1 and a held key is granted again, which
    /// breaks every fence and every holder that is still working.
    #[arg(long)]
    pub ephemeral: bool,

    /// How often /v1/events lists the backend for changes made by other
    /// clients and for expiries, while someone follows it [default: 500ms].
    #[arg(long, value_parser = crate::cli::duration)]
    pub events_interval: Option<Duration>,

    /// Close a connection that takes longer than this to send a request's
    /// head (from its opening, TLS handshake included, for its first
    /// request) [default: 10s].
    #[arg(long, value_parser = crate::cli::duration)]
    pub header_read_timeout: Option<Duration>,

    /// Close a connection idle this long between two requests; long polls
    /// and event streams are never idle [default: 60s].
    #[arg(long, value_parser = crate::cli::duration)]
    pub idle_timeout: Option<Duration>,

    /// Most connections open at once; past it the one idle longest is
    /// closed [default: three quarters of the file limit, which serve
    /// raises to its hard limit].
    #[arg(long)]
    pub max_connections: Option<usize>,

    /// Serve on an address other than loopback without --token-file:
    /// anyone who reaches it may then force-release and clean up. Without
    /// it such a listen address is refused.
    #[arg(long)]
    pub allow_anonymous: bool,

    /// How many lease kinds get a fencelock_backend_held series of their
    /// own on /metrics; the leases of other kinds are counted as
    /// kind="other" [default: 100].
    #[arg(long)]
    pub metrics_max_kinds: Option<usize>,

    /// Backend operations each client token may have in flight at once, in
    /// each of two lanes (renewals, and every other call); its further
    /// requests wait for their turn, so that one client's burst holds up
    /// another's call by at most this many operations. The admin token
    /// takes no turns [default: 16].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub client_concurrency: Option<u32>,
}

/// `--config FILE`: the flags of `serve` as TOML keys.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<String>,
    token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    events_interval: Option<String>,
    ephemeral: Option<bool>,
    header_read_timeout: Option<String>,
    idle_timeout: Option<String>,
    max_connections: Option<usize>,
    metrics_max_kinds: Option<usize>,
    client_concurrency: Option<u32>,
    allow_anonymous: Option<bool>,
}

/// The options of `serve` once the flags and `--config` are merged.
#[derive(Debug)]
struct Settings {
    listen: String,
    token_file: Option<PathBuf>,
    tls: Option<(PathBuf, PathBuf)>,
    events_interval: Duration,
    ephemeral: bool,
    limits: Limits,
    metrics_max_kinds: Option<usize>,
    client_concurrency: Option<u32>,
    allow_anonymous: bool,
}

impl ServeArgs {
    /// The flags over the config file over the defaults. A bad file is a
    /// usage error (exit 2) that names the file and the key.
    fn settings(self) -> Result<Settings, Error> {
        let file = match &self.config {
            None => ConfigFile::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::InvalidArgument(format!("cannot read --config {}: {e}", path.display()))
                })?;
                toml::from_str(&text).map_err(|e| {
                    Error::InvalidArgument(format!("--config {}: {e}", path.display()))
                })?
            }
        };
        let duration =
            |flag: Option<Duration>, key: &str, text: Option<String>, default| match (flag, text) {
                (Some(d), _) => Ok(d),
                (None, Some(text)) => crate::cli::duration(&text)
                    .map_err(|e| Error::InvalidArgument(format!("--config: {key} {text:?}: {e}"))),
                (None, None) => Ok(default),
            };
        let events_interval = duration(
            self.events_interval,
            "events_interval",
            file.events_interval,
            Duration::from_millis(500),
        )?;
        let defaults = Limits::default();
        let limits = Limits {
            header_read_timeout: duration(
                self.header_read_timeout,
                "header_read_timeout",
                file.header_read_timeout,
                defaults.header_read_timeout,
            )?,
            idle_timeout: duration(
                self.idle_timeout,
                "idle_timeout",
                file.idle_timeout,
                defaults.idle_timeout,
            )?,
            max_connections: self.max_connections.or(file.max_connections),
            ..defaults
        };
        if limits.header_read_timeout.is_zero() || limits.idle_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "header_read_timeout and idle_timeout must be longer than zero".into(),
            ));
        }
        if limits.max_connections == Some(0) {
            return Err(Error::InvalidArgument(
                "max_connections must be at least 1".into(),
            ));
        }
        let tls = match (
            self.tls_cert.or(file.tls_cert),
            self.tls_key.or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(Error::InvalidArgument(
                    "tls_cert and tls_key go together".into(),
                ))
            }
        };
        let client_concurrency = self.client_concurrency.or(file.client_concurrency);
        if client_concurrency == Some(0) {
            return Err(Error::InvalidArgument(
                "client_concurrency is 0: a client could never reach the backend; \
                 it must be at least 1"
                    .to_owned(),
            ));
        }
        Ok(Settings {
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| "127.0.0.1:7878".to_owned()),
            token_file: self.token_file.or(file.token_file),
            tls,
            events_interval,
            ephemeral: self.ephemeral || file.ephemeral.unwrap_or(false),
            limits,
            metrics_max_kinds: self.metrics_max_kinds.or(file.metrics_max_kinds),
            client_concurrency,
            allow_anonymous: self.allow_anonymous || file.allow_anonymous.unwrap_or(false),
        })
    }
}

/// Serves until SIGINT or SIGTERM, then shuts down cleanly.
pub async fn run(url: &str, args: ServeArgs, out: Output) -> Result<u8, Error> {
    let args = args.settings()?;
    let backend = fencelock::open_backend(url).await?;
    if !backend.capabilities().persistent && !args.ephemeral {
        return Err(Error::InvalidArgument(format!(
            "the {} backend keeps its leases and tokens in this process only: a restarted \
             service would grant held keys again with tokens from 1, which fences cannot \
             tell from old ones; serve a persistent backend, or pass --ephemeral for tests",
            backend.name()
        )));
    }
    let fence = fencelock::open_fence(url).await?;
    let mut service = Service::builder(LockClient::new(backend))
        .fence(fence)
        // Opened from the same URL: one store for locks and fences.
        .fence_shares_store(true)
        .events_interval(args.events_interval);
    if let Some(max) = args.metrics_max_kinds {
        service = service.max_kinds(max);
    }
    if let Some(per_client) = args.client_concurrency {
        service = service.client_concurrency(usize::try_from(per_client).unwrap_or(usize::MAX));
    }
    if let Some(path) = &args.token_file {
        private(path)?;
        service = service.tokens(Tokens::from_file(path).map_err(Error::InvalidArgument)?);
    }
    let listen = resolve(&args.listen).await?;
    if !listen.ip().is_loopback() && args.token_file.is_none() && !args.allow_anonymous {
        return Err(Error::InvalidArgument(format!(
            "refusing to serve {listen} without --token-file: anyone who reaches it could \
             take, force-release and clean up every lock; give a token file, listen on \
             loopback, or pass --allow-anonymous for a network you trust (docs/http.md, \
             \"Threat model\")"
        )));
    }
    // A socket per client: the soft limit (1024 on most systems) would cap
    // the connections far below what the hard limit allows.
    if let Err(e) = fencelock_serve::raise_file_limit() {
        tracing::warn!(error = %e, "cannot raise the file limit");
    }
    let mut server = Server::bind(listen, service.build())
        .await
        .map_err(|e| Error::InvalidArgument(format!("cannot listen on {listen}: {e}")))?
        .limits(args.limits);
    let scheme = match args.tls {
        Some((cert, key)) => {
            server = server.tls(cert, key);
            "https"
        }
        None => "http",
    };
    let addr = server.local_addr();
    if out.json {
        println!(
            "{}",
            serde_json::json!({ "listening": format!("{scheme}://{addr}") })
        );
    } else if !out.quiet {
        println!("listening on {scheme}://{addr}");
    }
    server
        .run(stop_signal())
        .await
        .map_err(|e| Error::InvalidArgument(format!("the lock service failed: {e}")))?;
    Ok(0)
}

/// Refuses a token file that others than its owner may read (or write):
/// its tokens are the service's passwords.
fn private(path: &std::path::Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| {
            Error::InvalidArgument(format!("cannot read token file {}: {e}", path.display()))
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(Error::InvalidArgument(format!(
            "token file {} has mode {:04o}: group and others may read it; make it the \
             service user's alone (chmod 600), or hand it over as a systemd credential \
             (deploy/fencelock-serve.service) or a mounted secret",
            path.display(),
            mode & 0o7777
        )));
    }
    Ok(())
}

/// The address `--listen` names: an IP address with its port, or a host
/// name resolved to its first address.
async fn resolve(listen: &str) -> Result<SocketAddr, Error> {
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    let bad = |why: String| Error::InvalidArgument(format!("--listen {listen:?}: {why}"));
    if listen
        .rsplit_once(':')
        .is_none_or(|(host, _)| host.is_empty())
    {
        return Err(bad(
            "expected HOST:PORT, e.g. 127.0.0.1:7878 or localhost:7878".into(),
        ));
    }
    tokio::net::lookup_host(listen)
        .await
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("the name has no address".into()))
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example shipped in deploy/ stays a valid config file.
    #[test]
    fn the_shipped_config_parses() {
        let file: ConfigFile = toml::from_str(include_str!("../../../deploy/serve.toml"))
            .expect("deploy/serve.toml parses");
        assert_eq!(file.listen.as_deref(), Some("0.0.0.0:7878"));
        assert!(file.token_file.is_some());
    }

    /// The shipped image needs a token file, builds what Cargo.lock says
    /// with TLS, runs unprivileged and checks its health under TLS too; the
    /// unit makes its user, keeps a state directory and raises the file
    /// limit (docs/http.md, "Running it").
    #[test]
    fn the_shipped_image_and_unit_are_safe_as_they_are() {
        let image = include_str!("../../../deploy/Containerfile");
        let line = |start: &str| {
            image
                .lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start} line"))
        };
        assert!(line("ENTRYPOINT").contains("\"--token-file\""));
        let build = line("&& cargo build");
        assert!(
            build.contains("--locked") && build.contains("--features tls"),
            "{build}"
        );
        let user = line("USER").trim_start_matches("USER").trim();
        assert!(!user.is_empty() && !user.starts_with("root") && !user.starts_with('0'));
        let health = image.split("HEALTHCHECK").nth(1).expect("a health check");
        assert!(
            health.contains("https://127.0.0.1:7878/healthz"),
            "{health}"
        );

        let unit = include_str!("../../../deploy/fencelock-serve.service");
        for needed in [
            "DynamicUser=yes",
            "StateDirectory=fencelock",
            "LimitNOFILE=65536",
        ] {
            assert!(unit.lines().any(|l| l == needed), "the unit lacks {needed}");
        }
    }
}
