//! The vocabulary of `docs/semantics.md`: keys, owners, tokens, leases and
//! what a backend reports about a lease.

use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest key, owner or fenced-resource name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;

/// Longest lease a backend will grant. A lease is renewed while its holder
/// lives, so a TTL only bounds how long a *crashed* holder blocks others; a week
/// is already far past any sane value and anything longer is a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A fencing token: issued with every grant, strictly greater than every token
/// issued for the same key before (invariant I2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The largest token any backend issues: 2^53 − 1. Every integer up to
    /// it is exact in an IEEE double, so a token survives Redis's Lua
    /// numbers, JavaScript's `Number` and any JSON parser unchanged; a
    /// counter that would pass it fails with [`Error::TokensExhausted`]
    /// instead of repeating or rounding a token.
    pub const MAX: FencingToken = FencingToken((1 << 53) - 1);

    /// The largest token floor ([`crate::AcquireRequest::min_token`]) a
    /// backend accepts: 2^52. Floors are the one way a caller moves a
    /// counter, and several backends draw every key's tokens from one
    /// counter; capping floors at half the token space leaves 2^52 (about
    /// 4.5·10^15) grants after the highest floor, 142 years at a million
    /// grants a second, so no request can use up a store's tokens.
    pub const MAX_FLOOR: FencingToken = FencingToken(1 << 52);

    /// The raw value, e.g. to store in a fenced column.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Checks a requested floor against [`FencingToken::MAX_FLOOR`]; every
    /// backend that honours floors calls it, so the limit is one number
    /// everywhere.
    pub fn check_floor(floor: FencingToken) -> Result<FencingToken> {
        if floor > Self::MAX_FLOOR {
            return Err(Error::InvalidArgument(format!(
                "min_token {floor} is above the highest floor a backend accepts, {}",
                Self::MAX_FLOOR
            )));
        }
        Ok(floor)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for FencingToken {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        s.trim().parse::<u64>().map(FencingToken).map_err(|_| {
            Error::InvalidToken(format!(
                "{:?} is not an unsigned 64-bit integer",
                crate::error::shorten(s)
            ))
        })
    }
}

/// Checks the shared rule for names (keys, owners, fenced resources):
/// 1–255 bytes of UTF-8 without NUL or other control characters.
fn validate_name(what: &str, s: &str) -> std::result::Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} is {} bytes long; the limit is {MAX_NAME_LEN}",
            s.len()
        ));
    }
    if let Some((i, c)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!(
            "{what} contains the control character U+{:04X} at byte {i}",
            c as u32
        ));
    }
    Ok(())
}

/// Validates a fenced resource's name with the same rule as a [`LockKey`].
pub(crate) fn validate_resource(resource: &str) -> Result<()> {
    validate_name("resource name", resource).map_err(Error::InvalidKey)
}

/// The name of a lock, e.g. `workflow:123`: 1–255 bytes of UTF-8 with no NUL
/// or control characters.
///
/// Cheap to clone: a held lock's key is named by its guard, its renewal
/// schedule and some backends' caches, which share one copy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validates `key`.
    ///
    /// ```
    /// use fencelock_core::LockKey;
    /// assert!(LockKey::new("workflow:123").is_ok());
    /// assert!(LockKey::new("").is_err());
    /// assert!(LockKey::new("a\0b").is_err());
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        validate_name("lock key", &key).map_err(Error::InvalidKey)?;
        Ok(Self(key.into()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for LockKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LockKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        LockKey::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

/// Who holds a lock. The default, [`Owner::generate`], is unique per process
/// start, so two runs of the same program never share an identity.
///
/// Cheap to clone: every lease a client holds names the same owner.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// Validates an owner name (same rule as keys).
    pub fn new(owner: impl Into<String>) -> Result<Self> {
        let owner = owner.into();
        validate_name("owner", &owner).map_err(Error::InvalidOwner)?;
        Ok(Self(owner.into()))
    }

    /// `hostname:pid:random`: the host and process for people reading a lock
    /// table, the random part so that a restarted process with a recycled pid
    /// is a different owner.
    pub fn generate() -> Self {
        let host = hostname::get()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| validate_name("host", h).is_ok() && h.len() <= 200)
            .unwrap_or_else(|| "unknown-host".to_owned());
        let nonce: u32 = rand::thread_rng().gen();
        Self(format!("{host}:{}:{nonce:08x}", std::process::id()).into())
    }

    /// The owner as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for Owner {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Owner {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Owner::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Owner {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Owner::new(s)
    }
}

/// Shortest lease a client asks for. A guard trusts a lease for a little less
/// than its TTL ([`crate::ClockPolicy::valid_for`], invariant I5) and must
/// get a grant's answer back, and later each renewal's, within that window;
/// below about 100 ms an ordinary round trip to a server, or a scheduling
/// hiccup, outlasts it and every grant is lost at birth. Engines with a
/// coarser minimum (etcd) round up and report it in [`crate::Grant::ttl`].
pub(crate) const MIN_TTL: Duration = Duration::from_millis(100);

/// One grant: the key, who holds it and the grant's token. Renewal and
/// release name a lease by all three, so that a stale holder (same owner,
/// older token) can never touch its successor's lease (I3), and carry the
/// side of the key it holds, so that a backend renews or releases a reader
/// where it keeps readers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseId {
    /// The lock's key.
    pub key: LockKey,
    /// The holder.
    pub owner: Owner,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// Which side of the key the lease holds. Absent from the JSON of an
    /// exclusive lease, so a lease saved before read-write locks existed
    /// still reads back.
    #[serde(default, skip_serializing_if = "LockMode::is_exclusive")]
    pub mode: LockMode,
}

impl LeaseId {
    /// The exclusive lease of `owner` on `key` granted with `token`.
    pub fn new(key: LockKey, owner: Owner, token: FencingToken) -> Self {
        Self {
            key,
            owner,
            token,
            mode: LockMode::Exclusive,
        }
    }

    /// The same lease held in `mode`.
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// [`Error::Unsupported`] for a reader's lease: what a backend without
    /// read-write locks answers a renewal or release of one, so that it
    /// never serves a reader's lease as a writer's.
    pub fn exclusive_only(&self, backend: &'static str) -> Result<()> {
        match self.mode {
            LockMode::Exclusive => Ok(()),
            LockMode::Shared => Err(Error::unsupported(backend, "shared locks")),
        }
    }

    /// `Ok` when `found` (a renewal or release found this exact lease),
    /// otherwise [`Error::NotHeld`]: the one way every backend answers "not
    /// held".
    pub fn found(&self, found: bool) -> Result<()> {
        if found {
            Ok(())
        } else {
            Err(Error::not_held(self))
        }
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (owner {}, token {})",
            self.key, self.owner, self.token
        )
    }
}

/// Rejects TTLs a backend must never be asked for: below the 100 ms minimum
/// a guard cannot trust its lease for a round trip, and above [`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<Duration> {
    if ttl < MIN_TTL {
        return Err(Error::InvalidTtl(format!(
            "{} is shorter than the {} minimum: a lock could not be trusted \
             for the round trip of a grant or a renewal",
            humantime::format_duration(ttl),
            humantime::format_duration(MIN_TTL)
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::InvalidTtl(format!(
            "{} is longer than the {} maximum",
            humantime::format_duration(ttl),
            humantime::format_duration(MAX_TTL)
        )));
    }
    Ok(ttl)
}

/// Parses a human duration such as `500ms`, `30s`, `5m` or `1h 30m`.
///
/// Negative, empty and unit-less values are refused with a message naming the
/// accepted forms; the caller decides which error variant it becomes.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(fencelock_core::parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert!(fencelock_core::parse_duration("-5s").is_err());
/// ```
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{:?} is negative", crate::error::shorten(s)));
    }
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| {
        format!(
            "{:?} is not a duration like 500ms, 30s or 5m ({})",
            crate::error::shorten(s),
            crate::error::shorten(&e.to_string())
        )
    })
}

/// `url` with any password replaced by `***`, for logs, errors and `Debug`:
/// the password of the userinfo and the value of every query parameter
/// whose name contains `password`.
///
/// Passwords are often pasted unescaped, so the userinfo is taken to end at
/// the *last* `@` of the URL. When an `@` appears later (say, in the query),
/// more than the password is hidden: a mangled echo beats a leaked secret.
///
/// ```
/// use fencelock_core::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/locks"), "postgres://app:***@db:5432/locks");
/// assert_eq!(redact_url("redis://:pw@h/0"), "redis://:***@h/0");
/// assert_eq!(redact_url("postgres://u:pa/ss@h/db"), "postgres://u:***@h/db");
/// assert_eq!(redact_url("mysql://h/db?user=u&password=x&ssl=1"), "mysql://h/db?user=u&password=***&ssl=1");
/// assert_eq!(redact_url("user:pw@host"), "user:***@host");
/// assert_eq!(redact_url("sqlite:///var/lib/l.db"), "sqlite:///var/lib/l.db");
/// ```
pub fn redact_url(url: &str) -> String {
    // Without a scheme, treat the text as `user:password@host…` anyway.
    let start = url.find("://").map_or(0, |i| i + 3);
    let redacted = match url[start..].rfind('@') {
        Some(at) => {
            let userinfo = &url[start..start + at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..start],
                    &userinfo[..colon],
                    &url[start + at..]
                ),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    };
    let Some((base, query)) = redacted.split_once('?') else {
        return redacted;
    };
    let (query, fragment) = query
        .split_once('#')
        .map_or((query, None), |(q, f)| (q, Some(f)));
    let query = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.to_ascii_lowercase().contains("password") => {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    match fragment {
        Some(f) => format!("{base}?{query}#{f}"),
        None => format!("{base}?{query}"),
    }
}

/// Which side of a key a lease holds (see `docs/rwlock.md`).
///
/// An exclusive lease is a writer: it excludes every other lease on its key.
/// Shared leases (readers) exclude only exclusive ones. Both draw their
/// tokens from the key's one counter (I2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// A writer, or a plain lock: the only lease on its key.
    #[default]
    Exclusive,
    /// A reader: one of any number of shared leases, while no exclusive one
    /// is held.
    Shared,
}

impl LockMode {
    /// True for [`LockMode::Exclusive`].
    pub fn is_exclusive(&self) -> bool {
        *self == LockMode::Exclusive
    }

    /// `exclusive` or `shared`, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend reports about a lease. Times come from the backend's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock's key.
    pub key: LockKey,
    /// The holder.
    pub owner: Owner,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Optional label, e.g. `workflow`, `node` or `resource`.
    pub kind: Option<String>,
    /// Optional JSON metadata stored with the lease.
    pub data: Option<serde_json::Value>,
    /// When this lease was granted (backend clock; renewals keep it).
    pub acquired_at: DateTime<Utc>,
    /// When this lease ends unless renewed (backend clock).
    pub expires_at: DateTime<Utc>,
    /// `expires_at - now` measured on the backend's clock when it answered, so
    /// that readers need not compare their own clock with the backend's.
    #[serde(rename = "expires_in_ms", with = "duration_ms")]
    pub expires_in: Duration,
    /// Whether this is a writer's (or plain lock's) lease or a reader's.
    /// Absent in JSON written before read-write locks: exclusive.
    #[serde(default)]
    pub mode: LockMode,
}

mod duration_ms {
    //! Durations in JSON as integer milliseconds (`expires_in_ms` style).
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_naming_rule() {
        assert!(LockKey::new("a").is_ok());
        assert!(LockKey::new("é".repeat(127)).is_ok()); // 254 bytes
        assert!(matches!(
            LockKey::new("x".repeat(256)),
            Err(Error::InvalidKey(_))
        ));
        assert!(LockKey::new("x".repeat(255)).is_ok());
        for bad in ["", "a\0b", "tab\there", "line\n", "del\u{7f}", "c1\u{85}"] {
            assert!(
                matches!(LockKey::new(bad), Err(Error::InvalidKey(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generated_owners_are_valid_and_distinct() {
        let a = Owner::generate();
        let b = Owner::generate();
        assert!(Owner::new(a.as_str()).is_ok());
        assert_ne!(a, b);
        assert!(a.as_str().contains(&format!(":{}:", std::process::id())));
    }

    #[test]
    fn ttls_are_bounded() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(1)).is_err());
        assert!(validate_ttl(MIN_TTL - Duration::from_nanos(1)).is_err());
        assert!(validate_ttl(MIN_TTL).is_ok());
        assert!(validate_ttl(MAX_TTL).is_ok());
        assert!(validate_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(validate_ttl(Duration::MAX).is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "-5s", "five", "10", "1e9999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tokens_parse() {
        assert_eq!("42".parse::<FencingToken>().ok(), Some(FencingToken(42)));
        assert!("-1".parse::<FencingToken>().is_err());
        assert!("x".parse::<FencingToken>().is_err());
    }
}
