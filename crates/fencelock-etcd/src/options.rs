//! `etcd://` URLs.

use std::{fmt, time::Duration};

use fencelock_core::{parse_duration, Error, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// How to reach etcd. Built from a URL by [`EtcdOptions::from_url`]; its
/// `Debug` never shows the password.
///
/// `etcd://[user:password@]host:port[,host:port…][?options]`, options:
///
/// - `prefix=NAME` — keys live under `NAME/locks/` and `NAME/fences/`
///   (default `fencelock`);
/// - `user=NAME`, `password=SECRET` — etcd authentication (the userinfo
///   part of the URL works too);
/// - `tls=true` — HTTPS to every endpoint (needs the `tls` feature), with
///   `ca=PATH` (PEM CA bundle) and `domain=NAME` (name to verify);
/// - `timeout=DURATION` — the longest connecting (which waits for a first
///   answer) and any one request may take before it fails transiently
///   (default `5s`);
/// - `layout=etcd` — locks laid out as etcd's own `concurrency` package
///   lays them out, so that `etcdctl lock`/`elect` and Go's
///   `concurrency.Mutex`/`Election` contend with fencelock
///   ([`crate::EtcdLayoutBackend`]); `layout=fencelock` is the default;
/// - `namespace=NS` — with `layout=etcd`, a string put before every lock
///   name (as a Go client wrapped in etcd's `namespace` package does;
///   default none).
#[derive(Clone)]
pub struct EtcdOptions {
    /// Endpoints as `http(s)://host:port`; the client fails over between them.
    pub endpoints: Vec<String>,
    /// Key prefix.
    pub prefix: String,
    pub(crate) user: Option<(String, String)>,
    /// Use TLS.
    pub tls: bool,
    /// PEM CA bundle for TLS.
    pub ca_file: Option<String>,
    /// Server name to verify for TLS.
    pub domain: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// How locks are laid out in etcd.
    pub layout: Layout,
    /// With [`Layout::Etcd`]: what goes before every lock name.
    pub namespace: String,
    /// Which endpoints the requests go to (`balance=` in the URL).
    pub balance: Balance,
}

/// Which endpoints an [`EtcdOptions`] client sends its requests to
/// (`balance=` in the URL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Balance {
    /// Spread over every endpoint, as etcd's own clients do.
    #[default]
    All,
    /// All to the first endpoint that answers, in the URL's order; the
    /// others only while it does not. For a client beside one member
    /// across data centres: list that member first (`docs/etcd.md`).
    First,
}

/// How an [`EtcdOptions`] lays locks out in etcd (`layout=` in the URL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// fencelock's own: `P/locks/K` and the keys beside it (`docs/etcd.md`).
    #[default]
    Fencelock,
    /// etcd's `concurrency` package's: a key `K/<lease id in hex>` per
    /// contender, the holder being the oldest (`docs/etcd.md`, "The etcd
    /// layout").
    Etcd,
}

fn percent_decode(s: &str) -> Result<String> {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| Error::InvalidUrl("bad percent-encoding in the etcd URL".into()))
}

impl EtcdOptions {
    /// Parses an `etcd://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| Error::InvalidUrl("an etcd URL starts with etcd://host:port".into()))?;
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, q),
            None => (rest, ""),
        };
        let authority = authority.trim_end_matches('/');
        if authority.contains('/') {
            return Err(Error::InvalidUrl(
                "an etcd URL has no path: etcd://host:port[,host:port…]".into(),
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut options = EtcdOptions {
            endpoints: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            user: None,
            tls: false,
            ca_file: None,
            domain: None,
            timeout: Duration::from_secs(5),
            layout: Layout::Fencelock,
            namespace: String::new(),
            balance: Balance::All,
        };
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                Error::InvalidUrl("etcd credentials must be user:password".into())
            })?;
            options.user = Some((percent_decode(user)?, percent_decode(password)?));
        }
        let mut password_param = None;
        let mut user_param = None;
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "prefix" => options.prefix = value.into_owned(),
                "user" => user_param = Some(value.into_owned()),
                "password" => password_param = Some(value.into_owned()),
                "tls" => {
                    options.tls = match &*value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(Error::InvalidUrl("tls must be true or false".into())),
                    }
                }
                "layout" => {
                    options.layout = match &*value {
                        "fencelock" => Layout::Fencelock,
                        "etcd" => Layout::Etcd,
                        _ => {
                            return Err(Error::InvalidUrl(
                                "layout must be fencelock or etcd".into(),
                            ))
                        }
                    }
                }
                "namespace" => options.namespace = value.into_owned(),
                "balance" => {
                    options.balance = match &*value {
                        "all" => Balance::All,
                        "first" => Balance::First,
                        _ => return Err(Error::InvalidUrl("balance must be all or first".into())),
                    }
                }
                "ca" => options.ca_file = Some(value.into_owned()),
                "domain" => options.domain = Some(value.into_owned()),
                "timeout" => {
                    options.timeout = parse_duration(&value)
                        .map_err(|e| Error::InvalidUrl(format!("timeout: {e}")))?;
                }
                other => {
                    return Err(Error::InvalidUrl(format!(
                        "unknown etcd URL option {other:?}"
                    )))
                }
            }
        }
        match (user_param, password_param) {
            (Some(u), Some(p)) => options.user = Some((u, p)),
            (None, None) => {}
            _ => {
                return Err(Error::InvalidUrl(
                    "user and password must be given together".into(),
                ))
            }
        }
        let scheme = if options.tls { "https" } else { "http" };
        for host in hosts.split(',') {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| Error::InvalidUrl(format!("endpoint {host:?} is not host:port")))?;
            let valid_name = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c));
            if !valid_name || port.parse::<u16>().is_err() {
                return Err(Error::InvalidUrl(format!(
                    "endpoint {host:?} is not host:port"
                )));
            }
            options.endpoints.push(format!("{scheme}://{name}:{port}"));
        }
        if options.prefix.is_empty() || options.prefix.contains('\0') {
            return Err(Error::InvalidUrl("the key prefix must not be empty".into()));
        }
        if !options.namespace.is_empty() && options.layout != Layout::Etcd {
            return Err(Error::InvalidUrl(
                "namespace is for layout=etcd (the default layout has prefix)".into(),
            ));
        }
        if options.namespace.contains('\0') {
            return Err(Error::InvalidUrl("the namespace must not hold NUL".into()));
        }
        if options.timeout.is_zero() {
            return Err(Error::InvalidUrl("timeout must be positive".into()));
        }
        if options.tls && !cfg!(feature = "tls") {
            return Err(Error::Unsupported(
                "tls=true needs fencelock-etcd built with the `tls` feature".into(),
            ));
        }
        Ok(options)
    }

    /// Sets the credentials.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("password", &self.user.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .field("layout", &self.layout)
            .field("namespace", &self.namespace)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_endpoints_and_credentials() -> Result<()> {
        let o = EtcdOptions::from_url("etcd://root:s%40cret@10.0.0.1:2379,h2:2380?prefix=app")?;
        assert_eq!(o.endpoints, ["http://10.0.0.1:2379", "http://h2:2380"]);
        assert_eq!(o.prefix, "app");
        assert_eq!(o.user, Some(("root".into(), "s@cret".into())));
        let shown = format!("{o:?}");
        assert!(!shown.contains("cret"), "{shown}");
        Ok(())
    }

    #[test]
    fn the_etcd_layout_is_opt_in() -> Result<()> {
        assert_eq!(
            EtcdOptions::from_url("etcd://h:1")?.layout,
            Layout::Fencelock
        );
        let o = EtcdOptions::from_url("etcd://h:1?layout=etcd&namespace=app/")?;
        assert_eq!((o.layout, o.namespace.as_str()), (Layout::Etcd, "app/"));
        for bad in ["etcd://h:1?layout=zk", "etcd://h:1?namespace=app/"] {
            assert!(
                matches!(EtcdOptions::from_url(bad), Err(Error::InvalidUrl(_))),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn requests_spread_over_every_endpoint_unless_told_first() -> Result<()> {
        assert_eq!(
            EtcdOptions::from_url("etcd://h:1,g:2")?.balance,
            Balance::All
        );
        assert_eq!(
            EtcdOptions::from_url("etcd://h:1,g:2?balance=first")?.balance,
            Balance::First
        );
        assert!(matches!(
            EtcdOptions::from_url("etcd://h:1?balance=nearest"),
            Err(Error::InvalidUrl(m)) if m.contains("all or first")
        ));
        Ok(())
    }

    #[test]
    fn malformed_urls_never_echo_the_password() {
        for bad in [
            "http://u:s3cret@h:1",
            "etcd://u:s3cret@h",
            "etcd://u:s3cret@h:notaport",
            "etcd://u:s3cret@h:1/path",
            "etcd://u:s3cret@h:1?bogus=1",
            "etcd://h:1?user=u&password=s3cret&timeout=x",
            "etcd://h:1?password=s3cret",
            "etcd://us3cret@h:1",
        ] {
            match EtcdOptions::from_url(bad) {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
