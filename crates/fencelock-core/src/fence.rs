//! Fences: the check at a protected resource that refuses stale holders
//! (`docs/semantics.md`, invariant I7).
//!
//! A fence remembers, per resource, the highest token it has admitted. It
//! admits token `t` iff `t >= highest`, and then remembers `max(t, highest)`.
//! Equal tokens are admitted so that one holder can write many times; lower
//! tokens get [`Error::Stale`].
//!
//! Admit your token **before** you read the state you will modify: once the
//! new holder's token is admitted, a paused old holder can no longer write
//! between the new holder's read and its write.

use std::fmt;

use async_trait::async_trait;

use crate::{
    error::{Error, Result},
    metrics as m,
    types::{validate_resource, FencingToken, LockMode},
};

/// The outcome of offering a token to a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The token is at least the highest admitted; it is now recorded.
    Admitted,
    /// A higher token has been admitted; nothing changed.
    Stale {
        /// The highest admitted token.
        current: FencingToken,
    },
}

impl Admission {
    /// Turns a refusal into [`Error::Stale`] and counts it. Every fence,
    /// including the in-transaction SQL forms, reports through here.
    pub fn into_result(
        self,
        fence: &'static str,
        resource: &str,
        presented: FencingToken,
    ) -> Result<()> {
        match self {
            Admission::Admitted => Ok(()),
            Admission::Stale { current } => {
                ::metrics::counter!(m::FENCE_REJECTIONS, "fence" => fence).increment(1);
                tracing::warn!(fence, resource, %presented, %current, "fence refused a stale token");
                Err(Error::Stale {
                    resource: resource.to_owned(),
                    presented,
                    current,
                })
            }
        }
    }
}

/// What a fence that understands read-write locks keeps per resource
/// (`docs/rwlock.md`): the highest token admitted in either mode and the
/// highest writer token, with the rule [`Fence::try_admit_as`] applies to
/// them. Its text form, which key-value fences store, is `H`, or `H/W` when
/// the highest writer token `W` is lower (`0`: no writer yet); a bare
/// number, as every record from before read-write locks, is a writer's.
///
/// ```
/// # use fencelock_core::{FenceRecord, FencingToken, LockMode};
/// let writer = FenceRecord::admit(None, FencingToken(5), LockMode::Exclusive).unwrap();
/// let reader = FenceRecord::admit(Some(writer), FencingToken(7), LockMode::Shared).unwrap();
/// assert_eq!(reader.to_string(), "7/5");
/// assert_eq!(FenceRecord::parse("7/5"), Some(reader));
/// // A writer must reach every admitted token, readers' included.
/// assert_eq!(
///     FenceRecord::admit(Some(reader), FencingToken(6), LockMode::Exclusive),
///     Err(FencingToken(7))
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceRecord {
    highest: u64,
    /// 0 when no writer was admitted.
    writer: u64,
}

impl FenceRecord {
    /// The highest token admitted in either mode.
    pub fn highest(&self) -> FencingToken {
        FencingToken(self.highest)
    }

    /// The highest writer token admitted, if any.
    pub fn writer(&self) -> Option<FencingToken> {
        (self.writer > 0).then_some(FencingToken(self.writer))
    }

    /// The record after admitting `token` of a lease held in `mode` on top
    /// of `current` (`None`: nothing admitted yet), or the floor the token
    /// missed: a writer's token must reach the highest of all, a reader's
    /// the highest writer token.
    pub fn admit(
        current: Option<Self>,
        token: FencingToken,
        mode: LockMode,
    ) -> std::result::Result<Self, FencingToken> {
        let t = token.get();
        let (floor, next) = match (mode, current) {
            (LockMode::Exclusive, None) => (0, Self::writer_at(t)),
            (LockMode::Exclusive, Some(c)) => (c.highest, Self::writer_at(t)),
            (LockMode::Shared, None) => (
                0,
                Self {
                    highest: t,
                    writer: 0,
                },
            ),
            (LockMode::Shared, Some(c)) => (
                c.writer,
                Self {
                    highest: c.highest.max(t),
                    writer: c.writer,
                },
            ),
        };
        if t < floor {
            Err(FencingToken(floor))
        } else {
            Ok(next)
        }
    }

    fn writer_at(token: u64) -> Self {
        Self {
            highest: token,
            writer: token,
        }
    }

    /// Reads the text form (`H` or `H/W`); `None` when it is neither.
    pub fn parse(text: &str) -> Option<Self> {
        match text.split_once('/') {
            None => text.parse().ok().map(Self::writer_at),
            Some((h, w)) => Some(Self {
                highest: h.parse().ok()?,
                writer: w.parse().ok()?,
            }),
        }
    }
}

impl fmt::Display for FenceRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.highest == self.writer {
            write!(f, "{}", self.highest)
        } else {
            write!(f, "{}/{}", self.highest, self.writer)
        }
    }
}

/// The largest value [`Fence::write_value`] stores, in bytes: 64 KiB, which
/// every fence's store takes in one record (a SQL row, a Redis string, an
/// etcd key, a ZooKeeper node) with room to spare.
pub const MAX_FENCED_VALUE: usize = 64 * 1024;

/// Refuses a value larger than [`MAX_FENCED_VALUE`] as
/// [`Error::InvalidArgument`]: the rule [`Fence::write_value`] applies, for
/// callers that check before they reach a fence (the lock service).
pub fn validate_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_FENCED_VALUE {
        return Err(Error::InvalidArgument(format!(
            "the value is {} bytes; the limit is {MAX_FENCED_VALUE}",
            value.len()
        )));
    }
    Ok(())
}

/// A value of a fence's key-value store with the token of the write that
/// stored it ([`Fence::read_value`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedValue {
    /// The token the writer presented.
    pub token: FencingToken,
    /// The value's bytes, as written.
    pub value: Vec<u8>,
}

impl FencedValue {
    /// A value written with `token`.
    pub fn new(token: FencingToken, value: Vec<u8>) -> Self {
        Self { token, value }
    }

    /// The one-blob form that fences storing token and value in a single
    /// record (an etcd key, a ZooKeeper node) keep: the token in decimal, a
    /// newline, the value's bytes.
    ///
    /// ```
    /// # use fencelock_core::{FencedValue, FencingToken};
    /// let stored = FencedValue::new(FencingToken(7), b"{\"a\":1}".to_vec());
    /// assert_eq!(stored.to_record(), b"7\n{\"a\":1}");
    /// assert_eq!(FencedValue::from_record(&stored.to_record()), Some(stored));
    /// ```
    pub fn to_record(&self) -> Vec<u8> {
        let mut record = format!("{}\n", self.token.get()).into_bytes();
        record.extend_from_slice(&self.value);
        record
    }

    /// Reads [`FencedValue::to_record`]'s form; `None` when it is not.
    pub fn from_record(record: &[u8]) -> Option<Self> {
        let split = record.iter().position(|b| *b == b'\n')?;
        let token = std::str::from_utf8(&record[..split]).ok()?.parse().ok()?;
        Some(Self::new(FencingToken(token), record[split + 1..].to_vec()))
    }
}

/// A store of "highest admitted token" per resource.
#[async_trait]
pub trait Fence: Send + Sync + fmt::Debug {
    /// Short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Atomically admits `token` for `resource` if it is at least the highest
    /// admitted, recording it; otherwise reports the current highest.
    /// `resource` has already been validated by [`Fence::admit`].
    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission>;

    /// The highest token admitted for `resource`, if any.
    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>>;

    /// Admits `token` for `resource` or fails with [`Error::Stale`].
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        validate_resource(resource)?;
        self.try_admit(resource, token)
            .await?
            .into_result(self.name(), resource, token)
    }

    /// Whether this fence understands read-write locks
    /// ([`Fence::try_admit_as`]). On such a fence [`Fence::try_admit`] is
    /// the writer's admission and records the writer's token as well.
    fn shared(&self) -> bool {
        false
    }

    /// Atomically admits `token` of a lease held in `mode`
    /// (`docs/rwlock.md`): a writer's ([`LockMode::Exclusive`]) iff it is at
    /// least the highest token admitted in either mode, a reader's
    /// ([`LockMode::Shared`]) iff it is at least the highest *writer* token
    /// admitted, so that readers of one generation do not refuse one
    /// another while every reader and writer older than the last writer is
    /// refused. A refusal reports the floor the token missed. The default
    /// answers [`Error::Unsupported`]; fences that implement it claim
    /// [`Fence::shared`].
    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let _ = (resource, token, mode);
        Err(Error::unsupported(self.name(), "shared admission"))
    }

    /// The highest writer token admitted for `resource`, if any; the
    /// default answers [`Error::Unsupported`].
    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let _ = resource;
        Err(Error::unsupported(self.name(), "shared admission"))
    }

    /// Admits `token` of a lease held in `mode` (see [`Fence::try_admit_as`])
    /// or fails with [`Error::Stale`]. A guard's
    /// [`mode`](crate::GuardHandle::mode) says which to pass.
    ///
    /// ```
    /// # use fencelock_core::{Fence, FencingToken, LockMode, MemoryFence};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let fence = MemoryFence::new();
    /// fence.admit_shared("report", FencingToken(7), LockMode::Exclusive).await?;
    /// // Two readers after that writer, in any order.
    /// fence.admit_shared("report", FencingToken(9), LockMode::Shared).await?;
    /// fence.admit_shared("report", FencingToken(8), LockMode::Shared).await?;
    /// // A writer must be above every reader.
    /// assert!(fence.admit_shared("report", FencingToken(8), LockMode::Exclusive).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    async fn admit_shared(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<()> {
        validate_resource(resource)?;
        self.try_admit_as(resource, token, mode)
            .await?
            .into_result(self.name(), resource, token)
    }

    /// Whether this fence keeps a value per resource
    /// ([`Fence::try_admit_value`], [`Fence::read_value`]) in its own
    /// store, so that every client of that store sees it and it outlives
    /// the process that wrote it.
    fn values(&self) -> bool {
        false
    }

    /// Atomically admits `token` for `resource` as a writer (as
    /// [`Fence::try_admit`] does) and, only if it was admitted, stores
    /// `value` with it in the same step: no lower token can be admitted, and
    /// no other value stored, between the admission and the write. A
    /// refusal stores nothing. `resource` and `value` have already been
    /// validated by [`Fence::write_value`]. The default answers
    /// [`Error::Unsupported`]; fences that implement it claim
    /// [`Fence::values`].
    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        let _ = (resource, token, value);
        Err(Error::unsupported(self.name(), "fenced values"))
    }

    /// The value last stored for `resource` and the token that wrote it, if
    /// any; the default answers [`Error::Unsupported`].
    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let _ = resource;
        Err(Error::unsupported(self.name(), "fenced values"))
    }

    /// Admits `token` and stores `value` for `resource` in one step (see
    /// [`Fence::try_admit_value`]), or fails with [`Error::Stale`]. A
    /// resource name the fence refuses is [`Error::InvalidKey`], a value
    /// above [`MAX_FENCED_VALUE`] [`Error::InvalidArgument`].
    ///
    /// ```
    /// # use fencelock_core::{Fence, FencingToken, MemoryFence};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), fencelock_core::Error> {
    /// let fence = MemoryFence::new();
    /// fence.write_value("config", FencingToken(7), b"{\"v\":1}").await?;
    /// // A paused holder with an older token cannot overwrite it.
    /// assert!(fence.write_value("config", FencingToken(6), b"{\"v\":0}").await.is_err());
    /// let stored = fence.read_value("config").await?.expect("written");
    /// assert_eq!((stored.token, stored.value.as_slice()), (FencingToken(7), &b"{\"v\":1}"[..]));
    /// # Ok(())
    /// # }
    /// ```
    async fn write_value(&self, resource: &str, token: FencingToken, value: &[u8]) -> Result<()> {
        validate_resource(resource)?;
        validate_value(value)?;
        self.try_admit_value(resource, token, value)
            .await?
            .into_result(self.name(), resource, token)
    }

    /// Forgets `resource`: its highest tokens (writer and shared) and its
    /// stored value, so that the next admission starts from nothing. The
    /// operator's repair of a fence a token no grant issued has blocked
    /// (the service's admin-only `DELETE /v1/fences/{resource}`); never
    /// part of a holder's protocol. Answers the highest token it had, in
    /// either mode (`None`: nothing was admitted).
    ///
    /// One atomic step of the fence's store: an admission racing with it
    /// lands wholly before (and is forgotten, its value with it) or wholly
    /// after (and is kept). Every fence this library ships implements it;
    /// the default, for fences elsewhere, answers [`Error::Unsupported`].
    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let _ = resource;
        Err(Error::unsupported(self.name(), "resetting a fence"))
    }
}
