//! `redlock://` URLs: the nodes and the options this crate reads.

use std::{fmt, time::Duration};

use fencelock_core::{parse_duration, redact_url, Error, Result};
use fencelock_redis::RedisOptions;

/// Default [`RedlockOptions::max_ttl`].
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(60);

/// Default [`RedlockOptions::node_timeout`].
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);

/// Default [`RedlockOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request to one node may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    /// The wait for the node's connection while it opens.
    pub(crate) open: Duration,
    /// The wait for the answer once the request is sent.
    pub(crate) answer: Duration,
}

/// How to reach the nodes. Built from a URL by [`RedlockOptions::from_url`];
/// its `Debug` never shows a password.
///
/// `redlock://[user:password@]h1:p1,h2:p2,h3:p3[/db][?options]`: an odd
/// number (3 or more) of independent Redis servers sharing credentials and
/// database number. Query parameters:
///
/// - `max_ttl=DURATION` — the longest lease granted or renewed (default
///   `60s`); longer TTLs are refused with [`Error::InvalidTtl`]. A node
///   that lost its data (restart without persistence) waits this long
///   (plus 1 %) before it votes again, see `docs/redlock.md`;
/// - `node_timeout=DURATION` — the least bound of a request to one node,
///   counting the wait for a node's connection that is still being opened
///   (default `250ms`): the whole bound of the requests no lease limits
///   (inspect, list, stats). A lease's requests (the probe and grant of an
///   acquisition, a renewal, a release) may take up to a third of the TTL
///   when that is longer ([`RedlockOptions::lease_bound`]): a node that
///   answers within it is a vote like any other, however far away it
///   stands (docs/redlock.md, "Far nodes");
/// - `connect_timeout=DURATION` — the bound of opening one node's
///   connections (default `5s`). Opening takes several round trips, so it
///   is not bounded by `node_timeout`: it carries on in the background when
///   a request stops waiting for it, and
///   [`RedlockBackend::connect`](crate::RedlockBackend::connect)
///   waits up to this long for a majority;
/// - `prefix=NAME` and anything else a `redis://` URL takes are passed to
///   every node (see `fencelock_redis::RedisOptions`), except
///   `wait_replicas`/`wait_timeout` (the nodes have no replicas) and
///   `timeout` (use `node_timeout`).
#[derive(Clone)]
#[non_exhaustive]
pub struct RedlockOptions {
    /// One `redis://` configuration per node, in URL order.
    pub nodes: Vec<RedisOptions>,
    /// Longest lease; a restarted node's quarantine.
    pub max_ttl: Duration,
    /// Least bound of each request to one node; the whole bound of those
    /// no lease limits (see [`RedlockOptions::lease_bound`]).
    pub node_timeout: Duration,
    /// Bound of opening one node's connections.
    pub connect_timeout: Duration,
    redacted: String,
}

impl RedlockOptions {
    /// Parses a `redlock://` URL (see the type's docs).
    pub fn from_url(url: &str) -> Result<Self> {
        let redacted = redact_url(url);
        let rest = url
            .strip_prefix("redlock://")
            .ok_or_else(|| Error::InvalidUrl(format!("{redacted} is not a redlock:// URL")))?;
        let (authority_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match authority_path.find('/') {
            Some(i) => authority_path.split_at(i),
            None => (authority_path, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (&authority[..=i], &authority[i + 1..]),
            None => ("", authority),
        };
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(Error::InvalidUrl(format!("{redacted} names an empty host")));
        }
        if hosts.len() < 3 || hosts.len() % 2 == 0 {
            return Err(Error::InvalidUrl(format!(
                "redlock needs an odd number of nodes, 3 or more (got {}): with an even \
                 number a majority tolerates no more failures than with one node fewer",
                hosts.len()
            )));
        }
        let mut sorted = hosts.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::InvalidUrl(
                "a node is named twice: it would vote twice".into(),
            ));
        }
        let mut max_ttl = DEFAULT_MAX_TTL;
        let mut node_timeout = DEFAULT_NODE_TIMEOUT;
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut passthrough = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let duration =
                |v: &str| parse_duration(v).map_err(|e| Error::InvalidUrl(format!("{name}: {e}")));
            match name {
                "max_ttl" => max_ttl = duration(value)?,
                "node_timeout" => node_timeout = duration(value)?,
                "connect_timeout" => connect_timeout = duration(value)?,
                "timeout" | "wait_replicas" | "wait_timeout" => {
                    return Err(Error::InvalidUrl(format!(
                        "{name} is not a redlock option (the nodes have no replicas; \
                         bound requests with node_timeout)"
                    )))
                }
                _ => passthrough.push(pair),
            }
        }
        if max_ttl < Duration::from_millis(100) {
            return Err(Error::InvalidUrl("max_ttl must be at least 100ms".into()));
        }
        if node_timeout.is_zero() || connect_timeout.is_zero() {
            return Err(Error::InvalidUrl(
                "node_timeout and connect_timeout must be positive".into(),
            ));
        }
        // A request for a lease is bounded by `lease_bound` instead
        // (`RedisBackend::bounded_by`).
        let timeouts = [
            format!("timeout={}us", node_timeout.as_micros().max(1)),
            format!("connect_timeout={}us", connect_timeout.as_micros().max(1)),
        ];
        let query: Vec<&str> = passthrough
            .into_iter()
            .filter(|p| !p.is_empty())
            .chain(timeouts.iter().map(String::as_str))
            .collect();
        let nodes = hosts
            .iter()
            .map(|host| {
                RedisOptions::from_url(&format!(
                    "redis://{userinfo}{host}{path}?{}",
                    query.join("&")
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            nodes,
            max_ttl,
            node_timeout,
            connect_timeout,
            redacted,
        })
    }

    /// The bound of one node's request for a lease of `ttl`: a third of
    /// the TTL, or `node_timeout` if that is longer. A node answering
    /// within it leaves two thirds of the lease to its holder, so it is
    /// never skipped for being slow (docs/redlock.md, "Far nodes").
    pub fn lease_bound(&self, ttl: Duration) -> Duration {
        self.node_timeout.max(ttl / 3)
    }

    /// The bound of a request for a lease whose TTL the request does not
    /// carry (a release): [`lease_bound`](Self::lease_bound) of `max_ttl`.
    pub fn longest_bound(&self) -> Duration {
        self.lease_bound(self.max_ttl)
    }

    /// The bounds of a request no lease limits: `node_timeout` each.
    pub(crate) fn plain_request(&self) -> Bound {
        Bound {
            open: self.node_timeout,
            answer: self.node_timeout,
        }
    }

    /// The bounds of a request for a lease of `ttl`: its answer within
    /// [`lease_bound`](Self::lease_bound); a connection still opening
    /// (several round trips) waited for up to the TTL, at most
    /// `connect_timeout`, since without that node's answer the request
    /// cannot be decided at all.
    pub(crate) fn lease_request(&self, ttl: Duration) -> Bound {
        let answer = self.lease_bound(ttl);
        Bound {
            open: self.connect_timeout.min(ttl).max(answer),
            answer,
        }
    }

    /// [`lease_request`](Self::lease_request) for a lease whose TTL the
    /// request does not carry (a release): that of `max_ttl`.
    pub(crate) fn release_request(&self) -> Bound {
        self.lease_request(self.max_ttl)
    }

    /// How many nodes make a majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The URL with any password replaced by `***`, for logs.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }
}

impl fmt::Debug for RedlockOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockOptions")
            .field("url", &self.redacted)
            .field("max_ttl", &self.max_ttl)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_share_credentials_database_and_prefix() -> Result<()> {
        let o = RedlockOptions::from_url(
            "redlock://:s3cret@a:1,b:2,c:3/4?prefix=app&max_ttl=30s&node_timeout=100ms",
        )?;
        assert_eq!(o.nodes.len(), 3);
        assert_eq!(o.quorum(), 2);
        assert_eq!(o.max_ttl, Duration::from_secs(30));
        assert!(o.nodes.iter().all(|n| n.prefix == "app"
            && n.timeout == Duration::from_millis(100)
            && n.connect_timeout == DEFAULT_CONNECT_TIMEOUT));
        let o = RedlockOptions::from_url("redlock://a:1,b:2,c:3?connect_timeout=2500ms")?;
        assert_eq!(o.connect_timeout, Duration::from_millis(2500));
        assert!(o.nodes.iter().all(|n| n.timeout == DEFAULT_NODE_TIMEOUT
            && n.connect_timeout == Duration::from_millis(2500)));
        Ok(())
    }

    #[test]
    fn a_lease_request_may_take_a_third_of_its_ttl_and_never_less_than_node_timeout() -> Result<()>
    {
        let o = RedlockOptions::from_url("redlock://a:1,b:2,c:3?node_timeout=500ms&max_ttl=9s")?;
        let ms = Duration::from_millis;
        assert_eq!(o.lease_bound(ms(3000)), ms(1000));
        assert_eq!(o.lease_bound(ms(900)), ms(500));
        assert_eq!(o.longest_bound(), ms(3000));
        // Opening takes round trips of its own: a lease's request waits
        // for it up to the TTL, at most connect_timeout (5 s).
        assert_eq!(o.lease_request(ms(3000)).open, ms(3000));
        assert_eq!(o.lease_request(ms(9000)).open, ms(5000));
        assert_eq!(o.release_request().answer, ms(3000));
        assert_eq!(o.plain_request().open, ms(500));
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        Ok(())
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for bad in [
            "redis://:s3cret@a:1",
            "redlock://:s3cret@a:1,b:2",
            "redlock://:s3cret@a:1,b:2,c:3,d:4",
            "redlock://:s3cret@a:1,a:1,c:3",
            "redlock://:s3cret@a:1,,c:3",
            "redlock://:s3cret@a:1,b:2,c:3?max_ttl=-1s",
            "redlock://:s3cret@a:1,b:2,c:3?max_ttl=10ms",
            "redlock://:s3cret@a:1,b:2,c:3?connect_timeout=0s",
            "redlock://:s3cret@a:1,b:2,c:3?node_timeout=0s",
            "redlock://:s3cret@a:1,b:2,c:3?wait_replicas=1",
            "redlock://:s3cret@a:1,b:2,c:3?prefix=a{b",
        ] {
            match RedlockOptions::from_url(bad) {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{bad}: {msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
