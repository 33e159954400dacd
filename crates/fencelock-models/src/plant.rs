//! Planted bugs: one-line deviations of the models, each written at the
//! line it changes, so that the mutation suite (`tests/it/mutations.rs`,
//! the table [`crate::bounds::MUTANTS`]) can plant them one at a time and
//! require a bound CI runs to catch each. A model whose checks pass with
//! a planted bug in it proves nothing about that line; `docs/safety.md`
//! lists what catches each one.
//!
//! Every model's configuration has a `plant` (none in the models
//! themselves): the test suite's and `examples/check`'s only way in.

/// A planted bug. The doc of each says the deviation; the site says why
/// the line it changes matters.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plant {
    /// `GRANT` ignores the quarantine: `now < votes_from` is never true.
    GrantIgnoresQuarantine,
    /// `JOIN` quarantines nobody: a joining node votes at once (the
    /// first broken twins of both Redlock models).
    JoinWithoutQuarantine,
    /// `heal` rejoins a node with floor 0 instead of the formed
    /// majority's highest `hwm`.
    RejoinFloorZero,
    /// `heal`'s former rule: a node joins a formed majority that never
    /// granted anything as a new set, without quarantine.
    FreshJoin,
    /// A quorum of one node.
    QuorumOfOne,
    /// `GRANT` refuses a token only when it is *below* the counter or
    /// floor (`seen > t`): an equal token is granted again.
    TokenCheckOffByOne,
    /// `GRANT` grants any token (no `Stale`).
    NoTokenCheck,
    /// A node of the probe-round model grants a key another lease holds.
    GrantIgnoresLease,
    /// The guard trusts a grant for the whole TTL from its request
    /// instead of `ttl − drift` (I5's window dropped).
    TrustWholeTtl,
    /// The guard drops its margin beyond the drift (`ttl − drift` instead
    /// of `ttl − drift − margin`).
    TrustWithoutMargin,
    /// The guard counts its window on a node's clock instead of the
    /// client's monotonic one: a node clock stepped back lengthens it.
    TrustOnNodeClock,
    /// A single-server store grants a key whose lease has not ended.
    StoreGrantsHeldKey,
    /// A single-server store does not remember the token it issued.
    StoreForgetsCounter,
    /// A leader's renewal is trusted from its answer, not its request.
    RenewalTrustedFromAnswer,
    /// A single-server store never drops a lease that has ended.
    StoreKeepsExpiredLease,
    /// The fence compares the wrong way round: it admits a token at or
    /// *below* the highest admitted (`highest >= t`).
    FenceComparesBackwards,
    /// The fence records the token before it compares: the check then
    /// compares the token with itself, and every token passes (lowering
    /// the floor).
    FenceRecordsBeforeCheck,
    /// The resource does not persist its fence: a restart forgets the
    /// highest token admitted.
    FenceForgetsFloor,
    /// A waiter refused gives up instead of retrying.
    WaiterGivesUp,
    /// Resharding: the operator skips `handover` (clients run `join` and
    /// the new map at once).
    SkipHandover,
    /// Resharding: the operator publishes the next step before every
    /// client runs the current one.
    PublishEarly,
    /// Resharding: the second half of a two-shard grant is not floored
    /// with the authority's token.
    UnflooredSecondHalf,
    /// Resharding: a client opening on `handover` carries no watermark
    /// from `a` to `b`.
    NoWatermark,
}

impl Plant {
    /// The name the tests, `examples/check` and `docs/safety.md` use.
    pub const fn name(self) -> &'static str {
        match self {
            Plant::GrantIgnoresQuarantine => "grant-ignores-quarantine",
            Plant::JoinWithoutQuarantine => "join-without-quarantine",
            Plant::RejoinFloorZero => "rejoin-floor-zero",
            Plant::FreshJoin => "fresh-join",
            Plant::QuorumOfOne => "quorum-of-one",
            Plant::TokenCheckOffByOne => "token-check-off-by-one",
            Plant::NoTokenCheck => "no-token-check",
            Plant::GrantIgnoresLease => "grant-ignores-lease",
            Plant::TrustWholeTtl => "trust-whole-ttl",
            Plant::TrustWithoutMargin => "trust-without-margin",
            Plant::TrustOnNodeClock => "trust-on-node-clock",
            Plant::StoreGrantsHeldKey => "store-grants-held-key",
            Plant::StoreForgetsCounter => "store-forgets-counter",
            Plant::RenewalTrustedFromAnswer => "renewal-trusted-from-answer",
            Plant::StoreKeepsExpiredLease => "store-keeps-expired-lease",
            Plant::FenceComparesBackwards => "fence-compares-backwards",
            Plant::FenceRecordsBeforeCheck => "fence-records-before-check",
            Plant::FenceForgetsFloor => "fence-forgets-floor",
            Plant::WaiterGivesUp => "waiter-gives-up",
            Plant::SkipHandover => "skip-handover",
            Plant::PublishEarly => "publish-early",
            Plant::UnflooredSecondHalf => "unfloored-second-half",
            Plant::NoWatermark => "no-watermark",
        }
    }
}
