//! `redis://` / `rediss://` URLs and the options this crate reads from them.

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
///   `WAIT` gets `timeout + wait_timeout`).
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) connection_url: Url,
    /// Key prefix; keys are `PREFIX:{KEY}`.
    pub prefix: String,
    /// `WAIT` for this many replicas after acquire and renew (0 = off).
    pub wait_replicas: u32,
    /// Timeout of the `WAIT` command.
    pub wait_timeout: Duration,
    /// Bound of opening and of every command.
    pub timeout: Duration,
}

impl RedisOptions {
    /// Parses a `redis://[user:password@]host[:port][/db][?prefix=…]` URL
    /// (`rediss://` with the `tls` feature).
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed =
            Url::parse(url).map_err(|e| Error::InvalidUrl(format!("not a redis:// URL ({e})")))?;
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
            prefix: DEFAULT_PREFIX.to_owned(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            timeout: Duration::from_secs(5),
        };
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
                _ => passthrough.push((name.into_owned(), value.into_owned())),
            }
        }
        validate_prefix(&options.prefix)?;
        if options.timeout.is_zero() {
            return Err(Error::InvalidUrl("timeout must be positive".into()));
        }
        options.connection_url.set_query(None);
        if !passthrough.is_empty() {
            options
                .connection_url
                .query_pairs_mut()
                .extend_pairs(passthrough);
        }
        Ok(options)
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

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("timeout", &self.timeout)
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
    fn malformed_urls_never_echo_the_password() {
        for bad in [
            "redis://user:s3cret@[::1",
            "http://user:s3cret@host",
            "redis://user:s3cret@host/?prefix=a{b",
            "redis://user:s3cret@host/?wait_replicas=x",
            "redis://user:s3cret@host/?timeout=-1s",
            "redis://user:s3cret@:80",
            "not a url s3cret",
        ] {
            match RedisOptions::from_url(bad) {
                Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("s3cret"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
