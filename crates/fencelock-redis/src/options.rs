//! `redis://` / `rediss://` URLs (and their `+cluster` forms) and the
//! options this crate reads from them.

use std::{fmt, time::Duration};

use fencelock_core::{parse_duration, Error, Result};
use url::Url;

use crate::keys::validate_prefix;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// How to reach Redis and lay out keys. Built from a URL by
/// [`RedisOptions::from_url`]; its `Debug` never shows the password.
///
/// Query parameters read (and removed before the URL goes to the driver):
///
/// - `prefix=NAME` — key prefix (default `fencelock`), must not contain
///   `{ } * ? [ ] \ %`;
/// - `wait_replicas=N` — after each acquire and renew, run `WAIT N timeout`
///   and fail (transiently) when fewer replicas acknowledged; off by default;
/// - `wait_timeout=DURATION` — the `WAIT` timeout (default `100ms`);
/// - `timeout=DURATION` — the longest opening the backend or fence, and any
///   one command, may take before it fails transiently (default `5s`;
///   `WAIT` gets `timeout + wait_timeout`);
/// - `connect_timeout=DURATION` — the longest opening may take, when it
///   should differ from `timeout` (default: `timeout`). Opening takes
///   several round trips (the connection, the scripts, the pub/sub
///   connection), so a tight per-command `timeout` can be too tight for it;
/// - `layout=plain` — the lock of key `K` is the Redis key `K` itself, so
///   that fencelock and the single-instance `SET K random NX PX` locks of
///   other libraries exclude each other (docs/redis.md); `layout=fencelock`
///   is the default (`PREFIX:{K}` hashes).
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) connection_url: Url,
    /// With a `redis+cluster://` URL: one URL per listed node (the first is
    /// also `connection_url`); empty for a single server.
    pub(crate) cluster_nodes: Vec<Url>,
    /// With a `redis+sentinel://` URL: one URL per listed Sentinel (without
    /// credentials, which are the data nodes'), and the master's name.
    pub(crate) sentinels: Vec<Url>,
    pub(crate) master_name: Option<String>,
    /// Key prefix; keys are `PREFIX:{KEY}`.
    pub prefix: String,
    /// `WAIT` for this many replicas after acquire and renew (0 = off).
    pub wait_replicas: u32,
    /// Timeout of the `WAIT` command.
    pub wait_timeout: Duration,
    /// Bound of every command (and of opening, unless `connect_timeout`
    /// says otherwise).
    pub timeout: Duration,
    /// Bound of opening the backend or fence, and of reconnecting.
    pub connect_timeout: Duration,
    /// `layout=plain`: the lease is a string at the user's key itself.
    pub plain: bool,
}

impl RedisOptions {
    /// Parses a `redis://[user:password@]host[:port][/db][?prefix=…]` URL
    /// (`rediss://` with the `tls` feature).
    ///
    /// `redis+cluster://[user:password@]host1:port1,host2:port2,…[?…]`
    /// (`rediss+cluster://` with the `tls` feature) opens a Redis Cluster
    /// through the listed seed nodes; a database other than 0 is refused.
    ///
    /// `redis+sentinel://[user:password@]host1:port1,host2:port2,…/MASTER_NAME[?…]`
    /// (`rediss+sentinel://` with the `tls` feature) asks the listed
    /// Sentinels for the master named `MASTER_NAME`, and asks again when the
    /// master stops answering or turns replica (a failover). The user and
    /// password are the data nodes'; the Sentinels are asked without them.
    pub fn from_url(url: &str) -> Result<Self> {
        let (url, seeds, sentinel) = split_multi_host_url(url)?;
        let parsed =
            Url::parse(&url).map_err(|e| Error::InvalidUrl(format!("not a redis:// URL ({e})")))?;
        match parsed.scheme() {
            "redis" => {}
            "rediss" if cfg!(feature = "tls") => {}
            "rediss" => {
                return Err(Error::Unsupported(
                    "rediss:// needs fencelock-redis built with the `tls` feature".into(),
                ))
            }
            other => {
                return Err(Error::InvalidUrl(format!(
                    "scheme {other:?} is not redis:// or rediss://"
                )))
            }
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(Error::InvalidUrl("the redis URL has no host".into()));
        }
        let mut options = RedisOptions {
            connection_url: parsed.clone(),
            cluster_nodes: Vec::new(),
            sentinels: Vec::new(),
            master_name: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            plain: false,
        };
        let mut connect_timeout = None;
        let mut passthrough = Vec::new();
        for (name, value) in parsed.query_pairs() {
            let duration =
                |v: &str| parse_duration(v).map_err(|e| Error::InvalidUrl(format!("{name}: {e}")));
            match &*name {
                "prefix" => options.prefix = value.into_owned(),
                "wait_replicas" => {
                    options.wait_replicas = value.parse().map_err(|_| {
                        Error::InvalidUrl(format!("wait_replicas={value:?} is not a count"))
                    })?
                }
                "wait_timeout" => options.wait_timeout = duration(&value)?,
                "timeout" => options.timeout = duration(&value)?,
                "connect_timeout" => connect_timeout = Some(duration(&value)?),
                "layout" => {
                    options.plain = match &*value {
                        "plain" => true,
                        "fencelock" => false,
                        other => {
                            return Err(Error::InvalidUrl(format!(
                                "layout={other:?} is not `plain` or `fencelock`"
                            )))
                        }
                    }
                }
                _ => passthrough.push((name.into_owned(), value.into_owned())),
            }
        }
        validate_prefix(&options.prefix)?;
        if options.timeout.is_zero() {
            return Err(Error::InvalidUrl("timeout must be positive".into()));
        }
        options.connect_timeout = connect_timeout.unwrap_or(options.timeout);
        if options.connect_timeout.is_zero() {
            return Err(Error::InvalidUrl("connect_timeout must be positive".into()));
        }
        options.connection_url.set_query(None);
        if !passthrough.is_empty() {
            options
                .connection_url
                .query_pairs_mut()
                .extend_pairs(passthrough);
        }
        let seeds = match (seeds, sentinel) {
            (Some(seeds), true) => {
                let name = options.connection_url.path().trim_start_matches('/');
                if name.is_empty() || name.contains('/') {
                    return Err(Error::InvalidUrl(
                        "a redis+sentinel:// URL ends in /MASTER_NAME".into(),
                    ));
                }
                let name = percent_decode(name)?;
                options.master_name = Some(name);
                options.connection_url.set_path("");
                for seed in seeds {
                    let mut node = node_url(&options.connection_url, &seed, "sentinel")?;
                    let _ = node.set_username("");
                    let _ = node.set_password(None);
                    node.set_query(None);
                    options.sentinels.push(node);
                }
                None
            }
            (seeds, _) => seeds,
        };
        if options.plain && seeds.is_some() {
            return Err(Error::Unsupported(
                "layout=plain on a Redis Cluster: a user's key and its token counter \
                 would be in different slots"
                    .into(),
            ));
        }
        if let Some(seeds) = seeds {
            if !matches!(options.connection_url.path(), "" | "/" | "/0") {
                return Err(Error::InvalidUrl(
                    "a Redis Cluster has only database 0".into(),
                ));
            }
            for seed in seeds {
                let node = node_url(&options.connection_url, &seed, "cluster node")?;
                options.cluster_nodes.push(node);
            }
        }
        Ok(options)
    }

    /// Whether the URL names a master through Sentinel
    /// (`redis+sentinel://`).
    pub fn is_sentinel(&self) -> bool {
        self.master_name.is_some()
    }

    /// Whether the URL names a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        !self.cluster_nodes.is_empty()
    }

    /// The URL with any password replaced by `***`, for logs.
    pub fn redacted_url(&self) -> String {
        let mut url = self.connection_url.clone();
        if url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        url.to_string()
    }
}

/// `base` with the host and port of `seed` (`host[:port]`), a `what` of a
/// multi-host URL.
fn node_url(base: &Url, seed: &str, what: &str) -> Result<Url> {
    let mut node = base.clone();
    // The seed was parsed once already as part of a URL, so a failure here
    // is a malformed port or host.
    let (host, port) = match seed.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (seed, None),
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| Error::InvalidUrl(format!("{what} port {p:?} is not a port")))
        })
        .transpose()?;
    if host.is_empty() {
        return Err(Error::InvalidUrl(format!("a {what} has no host")));
    }
    node.set_host(Some(host))
        .and_then(|()| {
            node.set_port(port)
                .map_err(|()| url::ParseError::InvalidPort)
        })
        .map_err(|e| Error::InvalidUrl(format!("{what} {host:?}: {e}")))?;
    Ok(node)
}

/// A percent-encoded path segment, decoded.
fn percent_decode(segment: &str) -> Result<String> {
    url::form_urlencoded::parse(format!("n={}", segment.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| Error::InvalidUrl("the master name is malformed".into()))
}

/// For a `redis+cluster://` or `redis+sentinel://` URL (or their
/// `rediss+` forms): the same URL with the plain scheme and only the first
/// host, every host's `host:port`, and whether the hosts are Sentinels.
/// Other URLs come back unchanged, with `None`.
fn split_multi_host_url(url: &str) -> Result<(String, Option<Vec<String>>, bool)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_owned(), None, false));
    };
    let (plain, sentinel) = match scheme {
        "redis+cluster" => ("redis", false),
        "rediss+cluster" => ("rediss", false),
        "redis+sentinel" => ("redis", true),
        "rediss+sentinel" => ("rediss", true),
        _ => return Ok((url.to_owned(), None, false)),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // The password may contain ',' or '@' (percent-encoded or not): the
    // node list is what follows the last '@'.
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let seeds: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    let Some(first) = seeds.first() else {
        return Err(Error::InvalidUrl(format!(
            "the {scheme}:// URL has no host"
        )));
    };
    Ok((
        format!("{plain}://{userinfo}{first}{tail}"),
        Some(seeds),
        sentinel,
    ))
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &self.redacted_url())
            .field("cluster_nodes", &self.cluster_nodes.len())
            .field("sentinels", &self.sentinels.len())
            .field("master_name", &self.master_name)
            .field("prefix", &self.prefix)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("plain", &self.plain)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_and_stripped() -> Result<()> {
        let o = RedisOptions::from_url(
            "redis://u:s3cret@127.0.0.1:7000/2?prefix=app&wait_replicas=1&protocol=resp2",
        )?;
        assert_eq!(o.prefix, "app");
        assert_eq!(o.wait_replicas, 1);
        assert_eq!(
            o.connection_url.as_str(),
            "redis://u:s3cret@127.0.0.1:7000/2?protocol=resp2"
        );
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
        Ok(())
    }

    #[test]
    fn opening_is_bounded_by_timeout_unless_connect_timeout_says_otherwise() -> Result<()> {
        let o = RedisOptions::from_url("redis://h?timeout=200ms")?;
        assert_eq!(
            (o.timeout, o.connect_timeout),
            (Duration::from_millis(200), Duration::from_millis(200))
        );
        let o = RedisOptions::from_url("redis://h?connect_timeout=3s&timeout=200ms")?;
        assert_eq!(
            (o.timeout, o.connect_timeout),
            (Duration::from_millis(200), Duration::from_secs(3))
        );
        assert_eq!(o.connection_url.as_str(), "redis://h");
        assert!(matches!(
            RedisOptions::from_url("redis://h?connect_timeout=0s"),
            Err(Error::InvalidUrl(_))
        ));
        Ok(())
    }

    #[test]
    fn cluster_urls_list_every_node() -> Result<()> {
        let o = RedisOptions::from_url(
            "redis+cluster://u:s%2C3cret@10.0.0.1:7000,10.0.0.2:7001,host3?prefix=app&protocol=resp3",
        )?;
        assert!(o.is_cluster());
        assert_eq!(o.prefix, "app");
        let nodes: Vec<&str> = o.cluster_nodes.iter().map(Url::as_str).collect();
        assert_eq!(
            nodes,
            [
                "redis://u:s%2C3cret@10.0.0.1:7000?protocol=resp3",
                "redis://u:s%2C3cret@10.0.0.2:7001?protocol=resp3",
                "redis://u:s%2C3cret@host3?protocol=resp3",
            ]
        );
        assert!(!RedisOptions::from_url("redis://127.0.0.1:7000")?.is_cluster());
        Ok(())
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() -> Result<()> {
        let o = RedisOptions::from_url(
            "redis+sentinel://u:s3cret@10.0.0.1:26379,10.0.0.2:26380/my%20master?prefix=app&layout=plain",
        )?;
        assert!(o.is_sentinel() && !o.is_cluster() && o.plain);
        assert_eq!(o.master_name.as_deref(), Some("my master"));
        let sentinels: Vec<&str> = o.sentinels.iter().map(Url::as_str).collect();
        assert_eq!(
            sentinels,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26380"]
        );
        assert_eq!(o.connection_url.password(), Some("s3cret"));
        assert!(!format!("{o:?}").contains("s3cret"));
        Ok(())
    }

    #[test]
    fn the_plain_layout_is_opt_in_and_not_for_a_cluster() -> Result<()> {
        assert!(!RedisOptions::from_url("redis://h")?.plain);
        assert!(!RedisOptions::from_url("redis://h?layout=fencelock")?.plain);
        assert!(RedisOptions::from_url("redis://h?layout=plain")?.plain);
        assert!(matches!(
            RedisOptions::from_url("redis+cluster://h1:1,h2:2?layout=plain"),
            Err(Error::Unsupported(_))
        ));
        Ok(())
    }

    #[test]
    fn malformed_urls_never_echo_the_password() {
        for bad in [
            "redis://user:s3cret@[::1",
            "http://user:s3cret@host",
            "redis://user:s3cret@host/?prefix=a{b",
            "redis://user:s3cret@host/?wait_replicas=x",
            "redis://user:s3cret@host/?timeout=-1s",
            "redis://user:s3cret@host/?connect_timeout=soon",
            "redis://user:s3cret@:80",
            "not a url s3cret",
            "redis+cluster://user:s3cret@",
            "redis+cluster://user:s3cret@h1:1,h2:x",
            "redis+cluster://user:s3cret@h1:1,h2:99999",
            "redis+cluster://user:s3cret@h1:1,:5",
            "redis+cluster://user:s3cret@h1:1,h2:2/3",
            "redis+sentinel://user:s3cret@h1:1,h2:2",
            "redis+sentinel://user:s3cret@h1:1,h2:2/",
            "redis+sentinel://user:s3cret@h1:1,h2:x/m",
            "redis+sentinel://user:s3cret@/m",
            "redis://user:s3cret@host/?layout=bogus",
        ] {
            match RedisOptions::from_url(bad) {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
