//! What the three models share: discrete time with drifting clocks, a
//! network that loses, delays and reorders, and the I2 ledger.

use std::fmt::Debug;

use crate::plant::Plant;

/// Time in ticks of the reference clock (the clients' clock). The models
/// run time forward only up to a horizon, which bounds the state space.
pub type Tick = u8;

/// Who sends and receives: the index of a client or of a node.
pub type Id = u8;

/// A fencing token (small in the models; the argument is about order, not
/// size).
pub type Token = u16;

/// Lease timing, in ticks. `drift` is how far a node's clock may run from
/// the client's over one TTL (the 1 % of `docs/semantics.md`, I5, scaled
/// up so that a few ticks show it); `margin` is the guard's extra margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timing {
    /// The lease's TTL, also `max_ttl`.
    pub ttl: Tick,
    /// The most a node's clock runs fast or slow over one TTL.
    pub drift: Tick,
    /// The guard's margin beyond the drift allowance.
    pub margin: Tick,
}

impl Timing {
    /// The defaults of every model: TTL 4, drift 1, margin 0 (I5's
    /// window is then TTL − drift: the margin is slack the model does not
    /// need).
    pub const fn new() -> Self {
        Self {
            ttl: 4,
            drift: 1,
            margin: 0,
        }
    }

    /// When a lease granted at `now` by a node whose clock runs at `rate`
    /// ends, on the reference clock.
    pub fn lease_end(&self, now: Tick, rate: Rate) -> Tick {
        rate.stretch(now, self.ttl, self.drift)
    }

    /// When the guard of a request sent at `sent` stops trusting its lease
    /// (I5: `t_sent + ttl·(1 − drift) − margin`).
    pub fn trust_end(&self, sent: Tick, plant: Option<Plant>) -> Tick {
        match plant {
            Some(Plant::TrustWholeTtl) => sent + self.ttl,
            // The margin covers what the drift does not: a node clock
            // that steps forward (`docs/safety.md`, "Clock steps").
            Some(Plant::TrustWithoutMargin) => (sent + self.ttl).saturating_sub(self.drift),
            _ => (sent + self.ttl).saturating_sub(self.drift + self.margin),
        }
    }

    /// The Redlock validity check: `ttl − elapsed − drift > 0`.
    pub fn still_valid(&self, sent: Tick, now: Tick) -> bool {
        now.saturating_sub(sent) + self.drift < self.ttl
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self::new()
    }
}

/// How a node's clock runs against the reference clock: the two extremes
/// the drift bound allows (every rate in between lies between them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rate {
    /// Runs fast: its durations end early on the reference clock.
    Fast,
    /// Runs slow: its durations end late.
    Slow,
}

impl Rate {
    /// Both rates, for the initial states.
    pub const ALL: [Rate; 2] = [Rate::Fast, Rate::Slow];

    /// The reference instant at which a duration of `len` ticks of this
    /// clock, begun at `now`, ends; the clock gains or loses `drift` ticks
    /// over it.
    pub fn stretch(self, now: Tick, len: Tick, drift: Tick) -> Tick {
        match self {
            Rate::Fast => now + len - drift,
            Rate::Slow => now + len + drift,
        }
    }
}

/// Every assignment of rates to `n` nodes.
pub fn rate_assignments(n: usize) -> Vec<Vec<Rate>> {
    (0..1usize << n)
        .map(|bits| {
            (0..n)
                .map(|i| Rate::ALL[(bits >> i) & 1])
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Messages in flight: a multiset, kept sorted so that equal networks hash
/// alike. Any message may be delivered next (reordering), stay while time
/// passes (delay) or never be delivered (loss).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Net<M>(Vec<M>);

impl<M: Ord + Clone> Net<M> {
    /// No message in flight.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// Puts `msg` in flight.
    pub fn send(&mut self, msg: M) {
        let at = self.0.partition_point(|m| m <= &msg);
        self.0.insert(at, msg);
    }

    /// Takes one copy of `msg` out; false when none is in flight.
    pub fn take(&mut self, msg: &M) -> bool {
        match self.0.binary_search(msg) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// The distinct messages in flight.
    pub fn distinct(&self) -> impl Iterator<Item = &M> {
        self.0
            .iter()
            .enumerate()
            .filter(|(i, m)| *i == 0 || self.0[i - 1] != **m)
            .map(|(_, m)| m)
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<M: Ord + Clone> Default for Net<M> {
    fn default() -> Self {
        Self::new()
    }
}

/// A step of a model: time passes, the network acts on a message, or an
/// actor acts on its own (`A`: a client starts, times out, releases; a
/// node restarts).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step<M, A> {
    /// One tick of the reference clock.
    Tick,
    /// The message arrives now (any message in flight: reordering).
    Deliver(M),

    /// An actor's own step.
    Act(A),
}

/// Adds the steps of time and network: a tick while `now` is below the
/// horizon, then a delivery of every distinct message in flight. A lost
/// message is one never delivered: every path that loses it has the same
/// steps as one that leaves it in flight, so loss needs no step of its own
/// (and the state space is spared the copies without it).
pub fn world_steps<M: Ord + Clone, A>(
    now: Tick,
    horizon: Tick,
    net: &Net<M>,
    steps: &mut Vec<Step<M, A>>,
) {
    if now < horizon {
        steps.push(Step::Tick);
    }
    for m in net.distinct() {
        steps.push(Step::Deliver(m.clone()));
    }
}

/// The I2 ledger, as the torture checker states it: a grant's token must
/// be above every token of a grant that completed before this grant's
/// acquisition began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    /// The highest token of a completed grant.
    pub highest: Token,
    /// Whether some grant broke I2.
    pub regressed: bool,
    /// Grants completed.
    pub grants: u8,
}

impl Ledger {
    /// Records a grant of `token` whose acquisition began when the highest
    /// completed token was `seen_at_start`.
    pub fn complete(&mut self, seen_at_start: Token, token: Token) {
        if token <= seen_at_start {
            self.regressed = true;
        }
        self.highest = self.highest.max(token);
        self.grants = self.grants.saturating_add(1);
    }
}

/// The nodes that make a majority of `n`.
pub const fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// How one model's check went: the figures `docs/safety.md` reports.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Distinct states explored.
    pub unique_states: usize,
    /// States generated, repeats included.
    pub states: usize,
    /// The deepest path explored.
    pub max_depth: usize,
    /// Properties with a discovery: a counterexample for `always`, an
    /// example for `sometimes`, with the path that shows it.
    pub discoveries: Vec<(&'static str, String)>,
}

impl Outcome {
    /// The path found for `property`, if any.
    pub fn discovery(&self, property: &str) -> Option<&str> {
        self.discoveries
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, path)| path.as_str())
    }
}

/// Runs `model` to completion on `threads` threads (or, with
/// `stop_at_failure`, to its first counterexample: a planted bug) and
/// collects what the checker found.
///
/// Depth first: its stack holds one path of states where a breadth-first
/// queue holds a whole frontier (160 MB against 1.2 GB for the deep
/// bound of `redlock-fast`, and less CPU per state), and a planted bug's
/// counterexample lies deep (two acquisitions and a fault), where depth
/// first reaches it long before breadth first would. The paths it finds
/// are not the shortest.
pub fn run<M>(model: M, threads: usize, stop_at_failure: bool) -> Outcome
where
    M: stateright::Model + Send + Sync + 'static,
    M::State: Clone + Debug + std::hash::Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    use stateright::{Checker, HasDiscoveries};
    let mut builder = model.checker().threads(threads);
    if stop_at_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    collect(builder.spawn_dfs().join())
}

fn collect<M, C>(checker: C) -> Outcome
where
    M: stateright::Model,
    M::State: Clone + Debug + PartialEq,
    M::Action: Clone + Debug + PartialEq,
    C: stateright::Checker<M>,
{
    let mut discoveries: Vec<(&'static str, String)> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| {
            // Each state with the action taken from it; the first state
            // shows the clock rates drawn.
            let steps: Vec<String> = path
                .into_vec()
                .into_iter()
                .enumerate()
                .flat_map(|(i, (state, action))| {
                    let from = (i == 0).then(|| format!("from {state:?}"));
                    from.into_iter().chain(action.map(|a| format!("{a:?}")))
                })
                .collect();
            (name, steps.join("\n"))
        })
        .collect();
    discoveries.sort_by_key(|(name, _)| *name);
    Outcome {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        discoveries,
    }
}

/// A lease as a store or a Redis node keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    /// The holder.
    pub owner: Id,
    /// Its token.
    pub token: Token,
    /// When it ends, on the reference clock (the keeper's clock drifts).
    pub end: Tick,
}

/// Ends `lease` if `owner` holds it with `token`: a late release of an
/// earlier lease must not end the one granted since.
pub fn release(lease: &mut Option<Held>, owner: Id, token: Token) {
    if lease.is_some_and(|l| l.owner == owner && l.token == token) {
        *lease = None;
    }
}

/// A single-server lock store with one counter (SQLite, PostgreSQL,
/// MySQL, memory): acquire with a token floor, renew, release. It keeps
/// its data (those backends persist); its clock drifts at `rate`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// Its clock.
    pub rate: Rate,
    /// The highest token it issued.
    pub counter: Token,
    /// The key's lease.
    pub lease: Option<Held>,
}

impl Store {
    /// An empty store.
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            counter: 0,
            lease: None,
        }
    }

    /// Grants the key to `owner` if it is free, with a token above the
    /// counter and `floor` (`min_token`).
    pub fn acquire(
        &mut self,
        owner: Id,
        floor: Token,
        now: Tick,
        t: &Timing,
        plant: Option<Plant>,
    ) -> Option<Token> {
        if self.lease.is_some() && plant != Some(Plant::StoreGrantsHeldKey) {
            return None;
        }
        let token = self.counter.max(floor) + 1;
        if plant != Some(Plant::StoreForgetsCounter) {
            self.counter = token;
        }
        self.lease = Some(Held {
            owner,
            token,
            end: t.lease_end(now, self.rate),
        });
        Some(token)
    }

    /// Extends the lease if `owner` holds it with `token`.
    pub fn renew(&mut self, owner: Id, token: Token, now: Tick, t: &Timing) -> bool {
        match &mut self.lease {
            Some(l) if l.owner == owner && l.token == token => {
                l.end = t.lease_end(now, self.rate);
                true
            }
            _ => false,
        }
    }

    /// Ends the lease if `owner` holds it with `token`.
    pub fn release(&mut self, owner: Id, token: Token) {
        release(&mut self.lease, owner, token);
    }

    /// Drops a lease that has ended (an expired lease is free, I6).
    pub fn expire(&mut self, now: Tick, plant: Option<Plant>) {
        if self.lease.is_some_and(|l| l.end <= now) && plant != Some(Plant::StoreKeepsExpiredLease)
        {
            self.lease = None;
        }
    }
}
