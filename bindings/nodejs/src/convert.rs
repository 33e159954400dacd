//! Values between JavaScript and the facade: durations, fencing tokens,
//! and the plain objects (`#[napi(object)]`) a lease, a backend's counts
//! and an election's leader are given as. Conversions fail with the
//! facade's own error, which [`crate::errors`] turns into a JavaScript one
//! where the call settles.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use fencelock::FencingToken;
use napi::bindgen_prelude::{BigInt, Either};
use napi_derive::napi;

/// A duration from JavaScript: milliseconds, or a string such as `'30s'`.
pub(crate) type JsDuration = Either<f64, String>;

/// A duration option: finite, non-negative milliseconds (`Infinity` only
/// where `forever` allows it), or a duration string parsed like the CLI's.
pub(crate) fn duration(
    value: &JsDuration,
    what: &str,
    forever: bool,
) -> fencelock::Result<Duration> {
    match value {
        Either::A(ms) if ms.is_infinite() && *ms > 0.0 && forever => Ok(Duration::MAX),
        Either::A(ms) if ms.is_finite() && *ms >= 0.0 => {
            Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| bad(what, &ms.to_string()))
        }
        Either::A(ms) => Err(bad(what, &ms.to_string())),
        Either::B(text) => fencelock::parse_duration(text).map_err(|_| bad(what, text)),
    }
}

fn bad(what: &str, value: &str) -> fencelock::Error {
    let message = format!(
        "{what} {:?} is not a duration (milliseconds, or e.g. '30s')",
        fencelock::shorten(value)
    );
    if what == "ttl" {
        fencelock::Error::InvalidTtl(message)
    } else {
        fencelock::Error::InvalidArgument(message)
    }
}

pub(crate) fn opt_duration(
    value: &Option<JsDuration>,
    what: &str,
    forever: bool,
) -> fencelock::Result<Option<Duration>> {
    value
        .as_ref()
        .map(|v| duration(v, what, forever))
        .transpose()
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A token from JavaScript: a `bigint`, unsigned and within 64 bits.
pub(crate) fn token_from_js(token: BigInt) -> fencelock::Result<FencingToken> {
    let (negative, value, lossless) = token.get_u64();
    if negative || !lossless {
        return Err(fencelock::Error::InvalidToken(
            "a fencing token is an unsigned 64-bit integer".into(),
        ));
    }
    Ok(FencingToken(value))
}

/// A token as a JavaScript `bigint` (tokens may pass 2^53).
pub(crate) fn token_to_js(token: FencingToken) -> BigInt {
    BigInt::from(token.get())
}

/// A std mutex's contents, whether or not a panic poisoned it: what they
/// guard stays consistent across a panic (a value is only taken out).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lease as the backend reports it.
#[napi(object)]
pub struct LockInfo {
    /// The key.
    pub key: String,
    /// Its holder.
    pub owner: String,
    /// The grant's fencing token.
    pub token: BigInt,
    /// The holder's label.
    pub kind: Option<String>,
    /// The holder's data.
    pub data: Option<serde_json::Value>,
    /// When it was granted (backend clock).
    pub acquired_at: DateTime<Utc>,
    /// When it ends unless renewed (backend clock).
    pub expires_at: DateTime<Utc>,
    /// Milliseconds left when read.
    pub expires_in_ms: f64,
    /// `'exclusive'` or `'shared'`.
    pub mode: String,
}

impl From<fencelock::LockInfo> for LockInfo {
    fn from(info: fencelock::LockInfo) -> Self {
        LockInfo {
            key: info.key.as_str().to_owned(),
            owner: info.owner.as_str().to_owned(),
            token: token_to_js(info.token),
            kind: info.kind,
            data: info.data,
            acquired_at: info.acquired_at,
            expires_at: info.expires_at,
            expires_in_ms: millis(info.expires_in),
            mode: info.mode.as_str().to_owned(),
        }
    }
}

/// What a backend holds.
#[napi(object)]
pub struct Stats {
    /// Unexpired leases.
    pub held: f64,
    /// Unexpired leases by kind (`''` for none).
    pub held_by_kind: HashMap<String, f64>,
    /// Unexpired leases by owner.
    pub held_by_owner: HashMap<String, f64>,
    /// Mean time the current leases have been held, in seconds.
    pub avg_hold_seconds: Option<f64>,
    /// Longest time a current lease has been held, in seconds.
    pub max_hold_seconds: Option<f64>,
    /// Expired leases still stored (what cleanup deletes).
    pub expired_not_cleaned: f64,
}

impl From<fencelock::Stats> for Stats {
    fn from(s: fencelock::Stats) -> Self {
        Stats {
            held: s.held as f64,
            held_by_kind: counts(s.held_by_kind),
            held_by_owner: counts(s.held_by_owner),
            avg_hold_seconds: s.avg_hold_seconds,
            max_hold_seconds: s.max_hold_seconds,
            expired_not_cleaned: s.expired_not_cleaned as f64,
        }
    }
}

fn counts(map: BTreeMap<String, u64>) -> HashMap<String, f64> {
    map.into_iter().map(|(k, v)| (k, v as f64)).collect()
}

/// The current leader of an election.
#[napi(object)]
pub struct Leader {
    /// The leader's owner name.
    pub owner: String,
    /// The value it published.
    pub value: Option<serde_json::Value>,
    /// Its term (fencing token).
    pub term: BigInt,
    /// Milliseconds left on its lease when read.
    pub expires_in_ms: f64,
}

impl From<fencelock::Leader> for Leader {
    fn from(l: fencelock::Leader) -> Self {
        Leader {
            owner: l.owner.as_str().to_owned(),
            value: l.value,
            term: token_to_js(l.term),
            expires_in_ms: millis(l.expires_in),
        }
    }
}
