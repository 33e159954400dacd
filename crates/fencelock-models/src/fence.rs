//! Fencing at the resource (`docs/semantics.md`, I7): a lock store grants
//! leases with tokens, holders write to a protected resource carrying
//! their token, and the resource's fence admits a write iff its token is
//! at least the highest it admitted (`fencelock_core::FenceRecord::admit`,
//! a writer's), remembering the higher of the two.
//!
//! The lock store is the single-server store of the other models
//! ([`Store`]); its clock drifts. Holders never check their lease before
//! writing (as the torture workers): a holder may pause anywhere, so its
//! write may leave after its lease ended, and writes are delayed and
//! reordered on the way. The fence alone stands between a stale holder
//! and the resource. The resource may restart, keeping its fence (it is
//! committed with the data it protects).
//!
//! The same bound checks liveness: faults (delays across a tick, resource
//! restarts) happen only up to the horizon; after it every message is
//! delivered before time passes, and time runs on only while a client
//! waits for a lease to end. Every path then ends (no step is left) once
//! every acquisition is over, which is where stateright judges an
//! `eventually` property.

use stateright::{Model, Property};

use crate::{
    common::{rate_assignments, world_steps, Id, Net, Step, Store, Tick, Timing, Token},
    plant::Plant,
};

/// What is checked, and how far.
#[derive(Clone, Debug)]
pub struct Config {
    /// Clients acquiring the one key and writing to the one resource.
    pub clients: usize,
    /// Acquisitions each client starts.
    pub attempts: u8,
    /// Writes a holder sends under each grant.
    pub writes: u8,
    /// Resource restarts, over the whole run.
    pub restarts: u8,
    /// The last tick of the faults: up to it messages may be delayed
    /// across ticks and the resource may restart; after it, none.
    pub horizon: Tick,
    /// Lease timing.
    pub timing: Timing,
    /// A planted bug (the mutation suite's; none in the model).
    #[doc(hidden)]
    pub plant: Option<Plant>,
}

impl Config {
    /// The bound `cargo test` checks: 2 clients with two acquisitions
    /// each and one write under each grant, one resource restart, TTL 2,
    /// faults up to tick 2.
    pub fn small() -> Self {
        Self {
            clients: 2,
            attempts: 2,
            writes: 1,
            restarts: 1,
            horizon: 2,
            timing: Timing {
                ttl: 2,
                ..Timing::new()
            },
            plant: None,
        }
    }

    /// The last tick of any path: past the horizon, time runs on only
    /// while a client waits, and each wait ends with a lease granted
    /// after the one before it (at most `ttl + drift` later), so every
    /// acquisition is over by then. A store that keeps an expired lease
    /// (planted) would keep a waiter waiting forever: this ends its path.
    fn deadline(&self) -> Tick {
        let grants = self.clients as Tick * self.attempts;
        self.horizon + grants * (self.timing.ttl + self.timing.drift)
    }
}

/// Requests to the store and writes to the resource. An acquisition's
/// answer travels with its delivery.
#[allow(missing_docs)] // c: client, t: token
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Acquire { c: Id },
    Release { c: Id, t: Token },
    Write { c: Id, t: Token },
}

/// A client's acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring.
    Idle,
    /// Its request is on its way.
    Asking,
    /// Refused; asks again at `until` (the holder's expiry, which the
    /// refusal carries, and at least one tick: the backoff's first
    /// sleep).
    Waiting {
        /// When it asks again.
        until: Tick,
    },
    /// Granted `t`; `writes` left to send.
    Holding {
        /// The grant's token.
        t: Token,
        /// Writes not sent yet.
        writes: u8,
    },
}

/// A client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    attempts_left: u8,
    /// Its grants so far (liveness).
    granted: u8,
    phase: Phase,
}

/// The whole system, with what the properties read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: Tick,
    store: Store,
    clients: Vec<Client>,
    /// The resource's fence: the highest token admitted (`None`: none
    /// yet, no record).
    fence: Option<Token>,
    restarts_left: u8,
    net: Net<Msg>,
    /// Every grant: token and holder, sorted.
    grants: Vec<(Token, Id)>,
    /// The highest token ever admitted (the fence's memory may fail).
    admitted: Token,
    /// A write admitted below a token admitted before it.
    stale_admitted: bool,
    /// A write admitted whose token is not its writer's grant alone.
    foreign_admitted: bool,
    /// A write refused (liveness sanity: the fence stopped someone).
    refused: bool,
    /// A write admitted after a restart of the resource.
    admitted_after_restart: bool,
}

/// Steps of the clients and the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Client `c` asks for the key: a new acquisition, or again after a
    /// refusal.
    Ask(Id),
    /// Client `c` sends a write with its token.
    Write(Id),
    /// Client `c` releases its lease, its writes sent.
    Release(Id),
    /// The resource restarts.
    Restart,
}

/// The model.
#[derive(Clone, Debug)]
pub struct Fence(pub Config);

/// The fence's rule (`FenceRecord::admit` for a writer): admits `t` iff it
/// is at least the highest admitted, and then remembers the higher.
fn admit(fence: &mut Option<Token>, t: Token, plant: Option<Plant>) -> bool {
    if plant == Some(Plant::FenceRecordsBeforeCheck) {
        *fence = Some(t);
    }
    let admitted = match (*fence, plant) {
        (None, _) => true,
        (Some(highest), Some(Plant::FenceComparesBackwards)) => highest >= t,
        (Some(highest), _) => t >= highest,
    };
    if admitted {
        *fence = Some(fence.map_or(t, |highest| highest.max(t)));
    }
    admitted
}

impl Fence {
    /// Time may pass: freely up to the horizon; after it only with
    /// nothing in flight (no more delays), no idle client about to begin
    /// an acquisition, and a client waiting for a lease to end, up to the
    /// deadline.
    fn may_tick(&self, s: &State) -> bool {
        s.now >= self.0.horizon
            && s.now < self.0.deadline()
            && s.net.is_empty()
            && s.clients
                .iter()
                .all(|c| c.phase != Phase::Idle || c.attempts_left == 0)
            && s.clients
                .iter()
                .any(|c| matches!(c.phase, Phase::Waiting { until } if until > s.now))
    }

    fn deliver(&self, s: &mut State, msg: Msg) {
        let (now, plant) = (s.now, self.0.plant);
        match msg {
            Msg::Acquire { c } => {
                s.store.expire(now, plant);
                let client = &mut s.clients[usize::from(c)];
                match s.store.acquire(c, 0, now, &self.0.timing, plant) {
                    Some(t) => {
                        client.phase = Phase::Holding {
                            t,
                            writes: self.0.writes,
                        };
                        client.granted += 1;
                        let at = s.grants.partition_point(|g| *g <= (t, c));
                        s.grants.insert(at, (t, c));
                    }
                    None if plant == Some(Plant::WaiterGivesUp) => client.phase = Phase::Idle,
                    None => {
                        let end = s.store.lease.map_or(now, |l| l.end);
                        client.phase = Phase::Waiting {
                            until: end.max(now + 1),
                        };
                    }
                }
            }
            Msg::Release { c, t } => s.store.release(c, t),
            Msg::Write { c, t } => {
                if admit(&mut s.fence, t, plant) {
                    s.stale_admitted |= t < s.admitted;
                    s.admitted = s.admitted.max(t);
                    // Its writer's grant, and nobody else's.
                    s.foreign_admitted |= s.grants.iter().any(|g| g.0 == t && g.1 != c)
                        || !s.grants.contains(&(t, c));
                    s.admitted_after_restart |= s.restarts_left < self.0.restarts;
                } else {
                    s.refused = true;
                }
            }
        }
    }
}

impl Model for Fence {
    type State = State;
    type Action = Step<Msg, Act>;

    fn init_states(&self) -> Vec<State> {
        rate_assignments(1)
            .into_iter()
            .map(|rates| State {
                now: 0,
                store: Store::new(rates[0]),
                clients: vec![
                    Client {
                        attempts_left: self.0.attempts,
                        granted: 0,
                        phase: Phase::Idle,
                    };
                    self.0.clients
                ],
                fence: None,
                restarts_left: self.0.restarts,
                net: Net::new(),
                grants: Vec::new(),
                admitted: 0,
                stale_admitted: false,
                foreign_admitted: false,
                refused: false,
                admitted_after_restart: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, steps: &mut Vec<Self::Action>) {
        world_steps(s.now, self.0.horizon, &s.net, steps);
        if self.may_tick(s) {
            steps.push(Step::Tick);
        }
        for (i, c) in s.clients.iter().enumerate() {
            let id = i as Id;
            match c.phase {
                Phase::Idle if c.attempts_left > 0 => steps.push(Step::Act(Act::Ask(id))),
                Phase::Waiting { until } if until <= s.now => steps.push(Step::Act(Act::Ask(id))),
                Phase::Holding { writes: 0, .. } => steps.push(Step::Act(Act::Release(id))),
                Phase::Holding { .. } => steps.push(Step::Act(Act::Write(id))),
                _ => {}
            }
        }
        if s.restarts_left > 0 && s.now < self.0.horizon {
            steps.push(Step::Act(Act::Restart));
        }
    }

    fn next_state(&self, last: &State, step: Self::Action) -> Option<State> {
        let mut s = last.clone();
        match step {
            Step::Tick => s.now += 1,
            Step::Deliver(m) => {
                s.net.take(&m);
                self.deliver(&mut s, m);
            }
            Step::Act(Act::Ask(c)) => {
                let client = &mut s.clients[usize::from(c)];
                if client.phase == Phase::Idle {
                    client.attempts_left -= 1;
                }
                client.phase = Phase::Asking;
                s.net.send(Msg::Acquire { c });
            }
            Step::Act(Act::Write(c)) => {
                if let Phase::Holding { t, writes } = &mut s.clients[usize::from(c)].phase {
                    *writes -= 1;
                    s.net.send(Msg::Write { c, t: *t });
                }
            }
            Step::Act(Act::Release(c)) => {
                let client = &mut s.clients[usize::from(c)];
                if let Phase::Holding { t, .. } = client.phase {
                    s.net.send(Msg::Release { c, t });
                }
                client.phase = Phase::Idle;
            }
            Step::Act(Act::Restart) => {
                // The fence is committed with the data it protects.
                if self.0.plant == Some(Plant::FenceForgetsFloor) {
                    s.fence = None;
                }
                s.restarts_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no stale write admitted", |_, s: &State| !s.stale_admitted),
            Property::always("admitted tokens were granted", |_, s: &State| {
                !s.foreign_admitted
            }),
            // The grants counted stay counted, so that two paths meeting
            // in one state agree on it (stateright does not tell them
            // apart).
            Property::eventually("every acquisition granted", |m, s: &State| {
                s.clients.iter().all(|c| c.granted == m.0.attempts)
            }),
            Property::sometimes("a stale write refused", |_, s: &State| s.refused),
            Property::sometimes("a write admitted after a restart", |_, s: &State| {
                s.admitted_after_restart
            }),
        ]
    }
}
