//! `zk://` URLs.

use std::time::Duration;

use fencelock_core::{parse_duration, Error, Result};

/// The default node prefix, under the chroot.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// How to reach ZooKeeper. Built from a URL by [`ZkOptions::from_url`].
///
/// `zk://host:port[,host:port…][/chroot][?options]`, options:
///
/// - `prefix=NAME` — nodes live under `/CHROOT/NAME/locks/` and
///   `/CHROOT/NAME/fences/` (default `fencelock`);
/// - `timeout=DURATION` — the longest connecting and any one request may
///   take before it fails with a time-out (default `5s`);
/// - `layout=curator` — keys are ZooKeeper paths under the chroot, with
///   contender nodes named as Apache Curator's `InterProcessMutex` and
///   `LeaderLatch` name theirs, so that Curator's and kazoo's holders and
///   fencelock's exclude each other (`docs/zookeeper.md`, [`ZkLayout`]);
///   default `fencelock`;
/// - `session_timeout=DURATION` — the ZooKeeper session asked for (default
///   `10s`; the server clamps it to 2–20 × its `tickTime`). In the default
///   layout leases do not depend on it (`docs/zookeeper.md`): it only
///   bounds how long a dead connection goes unnoticed. With
///   `layout=curator` contender nodes are the session's, so a lease's TTL
///   is at most half the timeout the server granted, and a crashed
///   holder's node goes when its session expires;
/// - `balance=first` — every request to the first server, in the URL's
///   order, that accepts a session, the others only while it does not
///   ([`ZkBalance`]); default `all`.
///
/// ZooKeeper authentication (digest, SASL) is not supported yet: a URL with
/// credentials is refused rather than silently connecting without them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ZkOptions {
    /// `host:port` of every server; the client fails over between them.
    pub servers: Vec<String>,
    /// Path every node lives under, `""` for the root.
    pub chroot: String,
    /// Node prefix under the chroot.
    pub prefix: String,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Requested session timeout.
    pub session_timeout: Duration,
    /// Where lock nodes live and how they are named.
    pub layout: ZkLayout,
    /// Which server the session is on (`balance=` in the URL).
    pub balance: ZkBalance,
}

/// Which server a backend's session is on (the `balance=` URL option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkBalance {
    /// Any: the client library picks a server at random, and another at
    /// random when it loses it (`balance=all`).
    #[default]
    All,
    /// The first server, in the URL's order, that accepts a session; a
    /// later one only while the earlier ones do not, and back to an
    /// earlier one once it accepts a session again (`balance=first`).
    /// For a client beside one member across data centres: list that
    /// member first (`docs/zookeeper.md`). A move is a new session, so
    /// not with `layout=curator`, whose contender nodes are the session's.
    First,
}

/// Where a backend keeps its lock nodes (the `layout=` URL option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkLayout {
    /// `/CHROOT/PREFIX/locks/kKEY/l-…` nodes (`layout=fencelock`).
    #[default]
    Fencelock,
    /// The key is a path under the chroot and contenders are named as
    /// Curator's recipes name them (`layout=curator`).
    Curator,
}

impl ZkOptions {
    /// Parses a `zk://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("zk://").ok_or_else(|| {
            Error::InvalidUrl("a ZooKeeper URL starts with zk://host:port".into())
        })?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, chroot) = match location.find('/') {
            Some(i) => (&location[..i], location[i..].trim_end_matches('/')),
            None => (location, ""),
        };
        if hosts.contains('@') {
            return Err(Error::InvalidUrl(
                "ZooKeeper credentials are not supported in a zk:// URL".into(),
            ));
        }
        let mut options = ZkOptions {
            servers: Vec::new(),
            chroot: chroot.to_owned(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: Duration::from_secs(5),
            session_timeout: Duration::from_secs(10),
            layout: ZkLayout::Fencelock,
            balance: ZkBalance::All,
        };
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "prefix" => options.prefix = value.into_owned(),
                "timeout" => {
                    options.timeout = parse_duration(&value)
                        .map_err(|e| Error::InvalidUrl(format!("timeout: {e}")))?;
                }
                "session_timeout" => {
                    options.session_timeout = parse_duration(&value)
                        .map_err(|e| Error::InvalidUrl(format!("session_timeout: {e}")))?;
                }
                "layout" => {
                    options.layout = match &*value {
                        "fencelock" => ZkLayout::Fencelock,
                        "curator" => ZkLayout::Curator,
                        _ => {
                            return Err(Error::InvalidUrl(format!(
                                "layout {value:?}: expected fencelock or curator"
                            )))
                        }
                    };
                }
                "balance" => {
                    options.balance = match &*value {
                        "all" => ZkBalance::All,
                        "first" => ZkBalance::First,
                        _ => {
                            return Err(Error::InvalidUrl(format!(
                                "balance {value:?}: expected all or first"
                            )))
                        }
                    };
                }
                other => {
                    return Err(Error::InvalidUrl(format!(
                        "unknown ZooKeeper URL option {other:?}"
                    )))
                }
            }
        }
        for host in hosts.split(',') {
            let valid = host.rsplit_once(':').is_some_and(|(name, port)| {
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c))
                    && port.parse::<u16>().is_ok()
            });
            if !valid {
                return Err(Error::InvalidUrl(format!(
                    "server {host:?} is not host:port"
                )));
            }
            options.servers.push(host.to_owned());
        }
        let bad_segment = |s: &str| s.is_empty() || s == "." || s == ".." || s.contains('\0');
        if !options.chroot.is_empty() && options.chroot[1..].split('/').any(bad_segment) {
            return Err(Error::InvalidUrl(
                "the chroot must be a path like /apps/locks".into(),
            ));
        }
        if bad_segment(&options.prefix) || options.prefix.contains('/') {
            return Err(Error::InvalidUrl(
                "the prefix must be one non-empty path segment".into(),
            ));
        }
        if options.balance == ZkBalance::First && options.layout == ZkLayout::Curator {
            return Err(Error::InvalidUrl(
                "balance=first moves a client to another server in a new session, \
                 and in layout=curator a contender's node is its session's: use \
                 balance=all"
                    .into(),
            ));
        }
        if options.timeout.is_zero() || options.session_timeout.is_zero() {
            return Err(Error::InvalidUrl("timeouts must be positive".into()));
        }
        Ok(options)
    }

    /// The connect string the client library takes: `host:port,…`.
    pub(crate) fn connect_string(&self) -> String {
        self.servers.join(",")
    }

    /// The path all of this store's nodes live under.
    pub(crate) fn base(&self) -> String {
        format!("{}/{}", self.chroot, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_chroot_and_options() -> Result<()> {
        let o = ZkOptions::from_url("zk://10.0.0.1:2181,zk2:2182/apps/locks/?prefix=p&timeout=2s")?;
        assert_eq!(o.servers, ["10.0.0.1:2181", "zk2:2182"]);
        assert_eq!(o.chroot, "/apps/locks");
        assert_eq!(o.base(), "/apps/locks/p");
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert_eq!(ZkOptions::from_url("zk://h:1")?.base(), "/fencelock");
        assert_eq!(ZkOptions::from_url("zk://h:1")?.layout, ZkLayout::Fencelock);
        assert_eq!(
            ZkOptions::from_url("zk://h:1/apps?layout=curator")?.layout,
            ZkLayout::Curator
        );
        assert_eq!(ZkOptions::from_url("zk://h:1")?.balance, ZkBalance::All);
        assert_eq!(
            ZkOptions::from_url("zk://h:1,h:2?balance=first")?.balance,
            ZkBalance::First
        );
        Ok(())
    }

    #[test]
    fn malformed_urls_are_refused_without_echoing_secrets() {
        for bad in [
            "etcd://h:1",
            "zk://h",
            "zk://h:notaport",
            "zk://u:s3cret@h:1",
            "zk://h:1?bogus=1",
            "zk://h:1?timeout=x",
            "zk://h:1/a//b",
            "zk://h:1/a/../b",
            "zk://h:1?prefix=a/b",
            "zk://h:1?timeout=0s",
            "zk://h:1?layout=etcd",
            "zk://h:1?balance=nearest",
            "zk://h:1?balance=first&layout=curator",
        ] {
            match ZkOptions::from_url(bad) {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
