//! What the fencelock PostgreSQL and MySQL backends genuinely share: parsing
//! the library's own URL options, keeping passwords out of every message,
//! the rule for table prefixes, the driver-level (not SQL-level) error
//! classes of sqlx, the time limits on connecting and on every statement,
//! and the pool their statements run on (with the one-statement calls most
//! operations are: [`ConnectionPool::fetch_all`] and its siblings). The SQL
//! itself differs between the engines and lives in each backend crate,
//! except a fence's reset ([`FenceReset`]), which is the same transaction
//! on both.

use std::{fmt, future::Future, time::Duration};

use fencelock_core::{Acquire, BackendError, Error, Grant, LockInfo};
use url::Url;

mod fence;
mod pool;

pub use fence::{admission, FenceReset};
pub use pool::{open_pool, ConnectionPool, MapError, RowsAffected, SchemaCheck, Session};

/// The prefix used when the URL names none.
pub const DEFAULT_PREFIX: &str = "fencelock_";

/// Longest accepted table prefix. PostgreSQL truncates identifiers at 63
/// bytes and MySQL refuses names over 64; the longest name built from a
/// prefix is the prefix plus `locks_expires_idx` (17 bytes).
pub const MAX_PREFIX_LEN: usize = 40;

/// A connection URL split into the library's options and the rest, which is
/// handed to the driver.
#[derive(Clone)]
pub struct SqlUrl {
    /// The URL for the driver, without the library's own query parameters.
    pub driver_url: Url,
    /// Table-name prefix (`?table_prefix=`), validated as an identifier.
    pub prefix: String,
    /// Most connections in the pool (`?pool_max=`).
    pub pool_max: u32,
    /// How long to wait for a pooled connection (`?acquire_timeout=`).
    pub acquire_timeout: Duration,
    /// How long opening the backend may take, connection and schema check
    /// included (`?connect_timeout=`).
    pub connect_timeout: Duration,
    /// How long one operation may take, from taking a pooled connection to
    /// the last reply (`?op_timeout=`).
    pub op_timeout: Duration,
    /// Library options specific to one engine (name, value), e.g.
    /// `synchronous_commit` for PostgreSQL.
    pub extra: Vec<(String, String)>,
}

impl fmt::Debug for SqlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlUrl")
            .field("driver_url", &redact(&self.driver_url))
            .field("prefix", &self.prefix)
            .field("pool_max", &self.pool_max)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("extra", &self.extra)
            .finish()
    }
}

/// `url` with its passwords (userinfo and `password=` query values)
/// replaced by `***`, for messages and `Debug`.
pub fn redact(url: &Url) -> String {
    fencelock_core::redact_url(url.as_str())
}

/// Removes anything that looks like the password of `raw` from `message`, for
/// errors about URLs too broken to parse.
fn scrub(raw: &str, message: String) -> String {
    let start = raw.find("://").map_or(0, |i| i + 3);
    // The userinfo ends at the *last* `@`: passwords are pasted unescaped.
    let userinfo_password = raw[start..]
        .rfind('@')
        .and_then(|at| raw[start..start + at].split_once(':'))
        .map(|(_, password)| password);
    let query_passwords = raw
        .split_once('?')
        .map(|(_, query)| query)
        .into_iter()
        .flat_map(|query| query.split(['&', '#']))
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| name.to_ascii_lowercase().contains("password"))
        .map(|(_, value)| value);
    userinfo_password
        .into_iter()
        .chain(query_passwords)
        .filter(|p| !p.is_empty())
        .fold(message, |message, p| message.replace(p, "***"))
}

/// Why a URL was refused, with its passwords hidden.
pub fn invalid_url(url: &Url, why: impl fmt::Display) -> Error {
    Error::InvalidUrl(scrub(url.as_str(), format!("{}: {why}", redact(url))))
}

/// Checks a table prefix: a lowercase SQL identifier start (`[a-z_]`), then
/// `[a-z0-9_]`, at most [`MAX_PREFIX_LEN`] bytes. Lowercase only, because
/// PostgreSQL folds unquoted names and MySQL's case sensitivity depends on
/// the file system; one rule keeps every name the same on every engine.
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    let mut chars = prefix.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if !first_ok
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || prefix.len() > MAX_PREFIX_LEN
    {
        return Err(format!(
            "table prefix {prefix:?} must match [a-z_][a-z0-9_]* and be at most {MAX_PREFIX_LEN} bytes"
        ));
    }
    Ok(())
}

/// Default of `?connect_timeout=`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of `?op_timeout=`.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Parses `raw`, accepting only `schemes`, and takes out the library's own
/// query parameters: `table_prefix`, `pool_max`, `acquire_timeout`,
/// `connect_timeout`, `op_timeout`, and the engine-specific names in
/// `extra_names`. The first scheme is the one the
/// driver is given (so `mariadb://` becomes `mysql://`).
pub fn parse(raw: &str, schemes: &[&str], extra_names: &[&str]) -> Result<SqlUrl, Error> {
    let mut url = Url::parse(raw)
        .map_err(|e| Error::InvalidUrl(scrub(raw, format!("cannot parse the URL: {e}"))))?;
    if !schemes.contains(&url.scheme()) {
        return Err(invalid_url(
            &url,
            format_args!("the scheme must be one of {}", schemes.join(", ")),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid_url(&url, "the URL names no host"));
    }
    let mut parsed = SqlUrl {
        driver_url: url.clone(),
        prefix: DEFAULT_PREFIX.to_owned(),
        pool_max: 10,
        acquire_timeout: Duration::from_secs(10),
        connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        op_timeout: DEFAULT_OP_TIMEOUT,
        extra: Vec::new(),
    };
    let duration = |name: &str, value: &str| {
        fencelock_core::parse_duration(value)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| invalid_url(&url, format_args!("{name} must be a duration like 5s")))
    };
    let mut passthrough = Vec::new();
    for (name, value) in url.query_pairs() {
        match &*name {
            "table_prefix" => {
                validate_prefix(&value).map_err(|why| invalid_url(&url, why))?;
                parsed.prefix = value.into_owned();
            }
            "pool_max" => {
                parsed.pool_max = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid_url(&url, "pool_max must be a positive integer"))?;
            }
            "acquire_timeout" => parsed.acquire_timeout = duration(&name, &value)?,
            // The drivers do not bound connecting (sqlx only warns about
            // this parameter), so the library does.
            "connect_timeout" => parsed.connect_timeout = duration(&name, &value)?,
            "op_timeout" => parsed.op_timeout = duration(&name, &value)?,
            n if extra_names.contains(&n) => parsed.extra.push((n.to_owned(), value.into_owned())),
            _ => passthrough.push((name.into_owned(), value.into_owned())),
        }
    }
    {
        let mut driver = parsed.driver_url.clone();
        driver.set_query(None);
        if !passthrough.is_empty() {
            driver.query_pairs_mut().extend_pairs(&passthrough);
        }
        if driver.scheme() != schemes[0] {
            // `Url::set_scheme` refuses some special-scheme changes; these
            // are all non-special, so rebuilding the text is safe.
            let rest = &driver.as_str()[driver.scheme().len()..];
            driver =
                Url::parse(&format!("{}{rest}", schemes[0])).map_err(|e| invalid_url(&url, e))?;
        }
        parsed.driver_url = driver;
    }
    url.set_query(None);
    Ok(parsed)
}

/// Whether a driver-level error (not an error reported by the database)
/// means the connection or pool is in trouble and a retry may succeed.
/// Database errors are classified by each backend, by its engine's codes.
pub fn transient_driver_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

/// The error of an operation that got no answer within `limit`: an I/O
/// time-out, which [`classify`] reports as [`BackendError::timeout`].
/// (Each backend's error mapping adds what was being done.)
pub fn timed_out(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer from the server within {limit:?}"),
    ))
}

/// Whether `e` is an I/O time-out: the library's own ([`timed_out`]) or the
/// socket's. Either way the request may or may not have taken effect.
pub fn is_timed_out(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
}

/// Turns a driver error met while `context` into a [`BackendError`] of
/// `backend`: a time-out ([`is_timed_out`]) has an unknown outcome, and
/// the rest is transient or permanent as the engine's `transient` rule
/// says.
pub fn classify(
    backend: &'static str,
    context: &'static str,
    e: sqlx::Error,
    transient: fn(&sqlx::Error) -> bool,
) -> Error {
    let error = if is_unauthorized(&e) {
        // SQLSTATE class 28, "invalid authorization specification": a
        // wrong password, an unknown user (PostgreSQL 28P01/28000, MySQL
        // and MariaDB 1045 as 28000). The same credentials will be
        // refused again: said at once, as `unauthorized`.
        BackendError::unauthorized(
            backend,
            format!("{context}: the server refused the URL's credentials"),
            e,
        )
    } else if is_timed_out(&e) {
        BackendError::timeout(backend, format!("{context}: {e}"))
    } else if transient(&e) {
        BackendError::transient(backend, context, e)
    } else {
        BackendError::permanent(backend, context, e)
    };
    error.into()
}

/// Whether the server refused the credentials (SQLSTATE class 28).
pub fn is_unauthorized(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("28")))
}

/// Resolves the host of `url` (port `default_port` unless it names one),
/// within `limit`: a host the resolver does not know is an answer, given
/// at once (a transient I/O error, which callers that wait retry), where
/// the pool would retry the connection until most of its connect time-out
/// had passed. Literal addresses and socket paths are not looked up.
pub async fn resolve(url: &Url, default_port: u16, limit: Duration) -> Result<(), sqlx::Error> {
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Ok(());
    };
    if host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let port = url.port().unwrap_or(default_port);
    match tokio::time::timeout(limit, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(sqlx::Error::Io(e)),
        Err(_) => Err(timed_out(limit)),
    }
}

/// Runs `op`, giving up after `limit` with [`timed_out`]. A server that
/// accepts connections but never answers would otherwise hang the caller
/// for ever: no driver-level time-out covers a statement in flight.
/// Connections that `op` had taken must be [`Session`]s, so that giving up
/// does not hand a connection in mid-conversation back to the pool.
pub async fn bounded<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(limit, op)
        .await
        .unwrap_or_else(|_| Err(timed_out(limit)))
}

/// Converts a TTL to whole microseconds for SQL interval arithmetic.
pub fn ttl_micros(ttl: Duration) -> i64 {
    // TTLs are capped at a week by the core, far below i64 microseconds.
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// A server-computed remaining lease in microseconds, as a duration
/// (negative values, from rounding at the boundary, become zero).
pub fn micros_to_duration(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// What a reader's acquisition answers: a grant for `ttl` when `granted`
/// (`info` read from the row it wrote), else the holder `info` names, if
/// any.
pub fn reader_answer(granted: bool, info: Option<LockInfo>, ttl: Duration) -> Acquire {
    match (granted, info) {
        (true, Some(info)) => Acquire::Granted(Grant::new(info.token, ttl, info.expires_at)),
        (_, info) => Acquire::Held(info),
    }
}

/// The answers of a batched renewal, in the batch's order, read from the
/// rows its statement returned: each row's `i` (the renewal's 1-based
/// position in the batch) and `expires_at` (that lease's new end). A
/// renewal no row names was not held. A row that cannot be read is
/// `unreadable`'s error; a position outside the batch, `bad_reply`'s.
pub fn renewal_answers<R>(
    renewals: &[fencelock_core::Renewal],
    rows: &[R],
    unreadable: impl FnOnce(sqlx::Error) -> Error,
    bad_reply: impl FnOnce(String) -> Error,
) -> std::result::Result<Vec<fencelock_core::Result<fencelock_core::Grant>>, Error>
where
    R: sqlx::Row,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>:
        sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    &'static str: sqlx::ColumnIndex<R>,
{
    let extended = rows
        .iter()
        .map(|row| Ok((row.try_get("i")?, row.try_get("expires_at")?)))
        .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
        .map_err(unreadable)?;
    batch_answers(renewals, extended)
        .map_err(|i| bad_reply(format!("renewal {i} of {}", renewals.len())))
}

/// The answers of a batched renewal, in the batch's order, from what its
/// statement reported: the 1-based position of each renewal it extended and
/// that lease's new end. A renewal it did not extend was not held. `Err`
/// carries a position outside the batch (a reply of the wrong shape).
fn batch_answers(
    renewals: &[fencelock_core::Renewal],
    extended: impl IntoIterator<Item = (i64, sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>)>,
) -> std::result::Result<Vec<fencelock_core::Result<fencelock_core::Grant>>, i64> {
    let mut ends = vec![None; renewals.len()];
    for (i, expires_at) in extended {
        let slot = usize::try_from(i)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| ends.get_mut(i))
            .ok_or(i)?;
        *slot = Some(expires_at);
    }
    Ok(renewals
        .iter()
        .zip(ends)
        .map(|(r, end)| match end {
            Some(at) => Ok(fencelock_core::Grant::new(r.lease.token, r.ttl, at)),
            None => Err(Error::not_held(&r.lease)),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_taken_out_and_the_rest_passes() {
        let u = parse(
            "mariadb://u:secret@db:3306/app?table_prefix=x_&ssl-mode=required&pool_max=3",
            &["mysql", "mariadb"],
            &[],
        )
        .expect("valid");
        assert_eq!(u.prefix, "x_");
        assert_eq!(u.pool_max, 3);
        assert_eq!(u.driver_url.scheme(), "mysql");
        assert_eq!(u.driver_url.query(), Some("ssl-mode=required"));
        assert!(!format!("{u:?}").contains("secret"));
    }

    #[test]
    fn bad_urls_never_show_the_password() {
        for raw in [
            "postgres://u:hunter2@h/db?table_prefix=Bad-Name",
            "postgres://u:hunter2@h/db?pool_max=0",
            "postgres://u:hunter2@h/db?connect_timeout=0s",
            "postgres://u:hunter2@h/db?op_timeout=soon",
            "redis://u:hunter2@h/db",
            "postgres://u:hunter2@[::1/db",
            "postgres://u:hunter2@/db",
        ] {
            let e = parse(raw, &["postgres", "postgresql"], &[]).expect_err(raw);
            assert!(matches!(e, Error::InvalidUrl(_)), "{raw}: {e:?}");
            assert!(!e.to_string().contains("hunter2"), "{raw}: {e}");
            assert!(!format!("{e:?}").contains("hunter2"), "{raw}: {e:?}");
        }
    }

    #[test]
    fn timeouts_are_library_options() {
        let u = parse(
            "postgres://u@h/db?connect_timeout=2s&op_timeout=1500ms&sslmode=disable",
            &["postgres"],
            &[],
        )
        .expect("valid");
        assert_eq!(u.connect_timeout, Duration::from_secs(2));
        assert_eq!(u.op_timeout, Duration::from_millis(1500));
        assert_eq!(u.driver_url.query(), Some("sslmode=disable"));
        let defaults = parse("postgres://u@h/db", &["postgres"], &[]).expect("valid");
        assert_eq!(defaults.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(defaults.op_timeout, DEFAULT_OP_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_operation_without_an_answer_is_a_time_out() {
        let never = std::future::pending::<Result<(), sqlx::Error>>();
        let e = bounded(Duration::from_millis(10), never)
            .await
            .expect_err("pending");
        assert!(transient_driver_error(&e), "{e}");
        assert!(e.to_string().contains("no answer"), "{e}");
        let mapped = classify("test", "renewing", e, transient_driver_error);
        assert_eq!(
            mapped.status(),
            fencelock_core::ErrorStatus::Timeout,
            "{mapped}"
        );
        let refused = sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        let mapped = classify("test", "renewing", refused, transient_driver_error);
        assert_eq!(
            mapped.status(),
            fencelock_core::ErrorStatus::Transient,
            "{mapped}"
        );
    }

    #[test]
    fn prefixes_are_identifiers() {
        assert!(validate_prefix("fencelock_").is_ok());
        assert!(validate_prefix("_a1").is_ok());
        for bad in ["", "1a", "a-b", "A", "a;drop", &"a".repeat(41)] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
