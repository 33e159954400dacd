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
    types::{validate_resource, FencingToken},
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
}
