//! Resharding through two transition steps (`docs/sharding.md`,
//! `crates/fencelock-sharded`): one key moves from shard `a` to shard `b`
//! through the steps old (`a`), `join` (a first, then b floored with a's
//! token), `handover` (b first, then a floored with b's token) and new
//! (`b`), with clients on two adjacent steps at once, the watermark a
//! `handover` process carries from `a` to `b` when it opens, and the
//! operator who publishes the next step once every client runs the
//! current one.

use stateright::{Model, Property};

use crate::{
    common::{rate_assignments, world_steps, Id, Ledger, Net, Step, Store, Tick, Timing, Token},
    plant::Plant,
};

/// The two shards.
const A: usize = 0;
const B: usize = 1;

/// What is checked, and how far.
#[derive(Clone, Debug)]
pub struct Config {
    /// Clients.
    pub clients: usize,
    /// Acquisitions each client starts.
    pub attempts: u8,
    /// The last tick explored.
    pub horizon: Tick,
    /// Lease timing.
    pub timing: Timing,
    /// A planted bug (the mutation suite's; none in the model).
    #[doc(hidden)]
    pub plant: Option<Plant>,
}

impl Config {
    /// The bound `cargo test` checks.
    pub fn small() -> Self {
        Self {
            clients: 2,
            attempts: 1,
            horizon: 3,
            timing: Timing::new(),
            plant: None,
        }
    }
}

/// The shards a step takes a moving key on: the authority first (whose
/// token the grant carries), then the other floored with it.
fn plan(step: u8) -> &'static [usize] {
    match step {
        1 => &[A],
        2 => &[A, B],
        3 => &[B, A],
        _ => &[B],
    }
}

/// Requests to a shard and answers; `c` is the client, `r` its
/// acquisition number.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Acquire {
        c: Id,
        r: u8,
        shard: u8,
        floor: Token,
    },
    Acquired {
        c: Id,
        r: u8,
        shard: u8,
        token: Option<Token>,
    },
    Release {
        c: Id,
        shard: u8,
        token: Token,
    },
}

/// A client's acquisition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring.
    Idle,
    /// Waiting for the `i`th shard of its step's plan; `halves` taken so far.
    Acquiring {
        /// The index in the plan.
        i: u8,
        /// (shard, token) of each half taken.
        halves: Vec<(u8, Token)>,
    },
    /// Holds the key with the authority's token until `trust_end`.
    Holding {
        /// The lease's token (the authority's).
        token: Token,
        /// The halves, one per shard of the plan.
        halves: Vec<(u8, Token)>,
        /// The end of its trust window.
        trust_end: Tick,
    },
}

/// A client process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    step: u8,
    attempts_left: u8,
    attempt: u8,
    started: Tick,
    seen: Token,
    phase: Phase,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: Tick,
    shards: [Store; 2],
    clients: Vec<Client>,
    /// The newest step published.
    published: u8,
    net: Net<Msg>,
    ledger: Ledger,
    /// Some client was granted the key on the new map.
    moved: bool,
}

/// Own steps of clients and operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Client starts an acquisition.
    Start(Id),
    /// Client gives up on the shard it waits for.
    Timeout(Id),
    /// Client releases.
    Release(Id),
    /// Client (idle) reopens on the newest step.
    Reopen(Id),
    /// The operator publishes the next step.
    Publish,
}

/// The model.
#[derive(Clone, Debug)]
pub struct Resharding(pub Config);

impl Resharding {
    fn ask(&self, s: &mut State, c: usize, i: u8, floor: Token) {
        let cl = &s.clients[c];
        let shard = plan(cl.step)[usize::from(i)] as u8;
        s.net.send(Msg::Acquire {
            c: c as Id,
            r: cl.attempt,
            shard,
            floor,
        });
    }

    /// Ends an acquisition that failed, giving back the halves taken.
    fn fail(s: &mut State, c: usize) {
        if let Phase::Acquiring { halves, .. } = &s.clients[c].phase {
            for &(shard, token) in halves {
                s.net.send(Msg::Release {
                    c: c as Id,
                    shard,
                    token,
                });
            }
        }
        s.clients[c].phase = Phase::Idle;
    }

    fn answered(&self, s: &mut State, c: usize, r: u8, shard: u8, token: Option<Token>) {
        let now = s.now;
        let cl = &mut s.clients[c];
        let waiting = match &cl.phase {
            Phase::Acquiring { i, .. } => {
                cl.attempt == r && plan(cl.step)[usize::from(*i)] as u8 == shard
            }
            _ => false,
        };
        if !waiting {
            if let Some(token) = token {
                // A late grant: given back.
                s.net.send(Msg::Release {
                    c: c as Id,
                    shard,
                    token,
                });
            }
            return;
        }
        let Some(token) = token else {
            Self::fail(s, c);
            return;
        };
        let Phase::Acquiring { i, halves } = &mut cl.phase else {
            return;
        };
        halves.push((shard, token));
        let next = *i + 1;
        if usize::from(next) < plan(cl.step).len() {
            *i = next;
            // The authority's token floors the other shard, so that the
            // next step's authority counts above it.
            let floor = if self.0.plant == Some(Plant::UnflooredSecondHalf) {
                0
            } else {
                halves[0].1
            };
            self.ask(s, c, next, floor);
            return;
        }
        let halves = std::mem::take(halves);
        let token = halves[0].1;
        let trust_end = self.0.timing.trust_end(cl.started, self.0.plant);
        if now < trust_end {
            let seen = cl.seen;
            if cl.step == 4 {
                s.moved = true;
            }
            cl.phase = Phase::Holding {
                token,
                halves,
                trust_end,
            };
            s.ledger.complete(seen, token);
        } else {
            cl.phase = Phase::Acquiring { i: next, halves };
            Self::fail(s, c);
        }
    }
}

fn trusting(s: &State) -> usize {
    s.clients
        .iter()
        .filter(|c| matches!(c.phase, Phase::Holding { trust_end, .. } if s.now < trust_end))
        .count()
}

impl Model for Resharding {
    type State = State;
    type Action = Step<Msg, Act>;

    fn init_states(&self) -> Vec<State> {
        rate_assignments(2)
            .into_iter()
            .map(|rates| State {
                now: 0,
                shards: [Store::new(rates[0]), Store::new(rates[1])],
                clients: vec![
                    Client {
                        step: 1,
                        attempts_left: self.0.attempts,
                        attempt: 0,
                        started: 0,
                        seen: 0,
                        phase: Phase::Idle,
                    };
                    self.0.clients
                ],
                published: 1,
                net: Net::new(),
                ledger: Ledger::default(),
                moved: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, steps: &mut Vec<Self::Action>) {
        world_steps(s.now, self.0.horizon, &s.net, steps);
        let newest = s.published;
        for (i, c) in s.clients.iter().enumerate() {
            let id = i as Id;
            match c.phase {
                Phase::Idle => {
                    if c.attempts_left > 0 {
                        steps.push(Step::Act(Act::Start(id)));
                    }
                    if c.step != newest {
                        steps.push(Step::Act(Act::Reopen(id)));
                    }
                }
                Phase::Acquiring { .. } => steps.push(Step::Act(Act::Timeout(id))),
                Phase::Holding { .. } => steps.push(Step::Act(Act::Release(id))),
            }
        }
        // Adjacent steps only: the next step once every client runs this one.
        let everyone_on_newest =
            s.clients.iter().all(|c| c.step == newest) || self.0.plant == Some(Plant::PublishEarly);
        if everyone_on_newest && newest < 4 {
            steps.push(Step::Act(Act::Publish));
        }
    }

    fn next_state(&self, last: &State, step: Self::Action) -> Option<State> {
        let mut s = last.clone();
        let t = self.0.timing;
        match step {
            Step::Tick => {
                s.now += 1;
                for shard in &mut s.shards {
                    shard.expire(s.now, self.0.plant);
                }
            }
            Step::Deliver(m) => {
                s.net.take(&m);
                let now = s.now;
                match m {
                    Msg::Acquire { c, r, shard, floor } => {
                        let store = &mut s.shards[usize::from(shard)];
                        let token = store.acquire(c, floor, now, &t, self.0.plant);
                        s.net.send(Msg::Acquired { c, r, shard, token });
                    }
                    Msg::Release { c, shard, token } => {
                        s.shards[usize::from(shard)].release(c, token);
                    }
                    Msg::Acquired { c, r, shard, token } => {
                        self.answered(&mut s, usize::from(c), r, shard, token);
                    }
                }
            }
            Step::Act(Act::Start(c)) => {
                let c = usize::from(c);
                let (now, seen) = (s.now, s.ledger.highest);
                let cl = &mut s.clients[c];
                cl.attempts_left -= 1;
                cl.attempt += 1;
                cl.started = now;
                cl.seen = seen;
                cl.phase = Phase::Acquiring {
                    i: 0,
                    halves: Vec::new(),
                };
                self.ask(&mut s, c, 0, 0);
            }
            Step::Act(Act::Timeout(c)) => Self::fail(&mut s, usize::from(c)),
            Step::Act(Act::Release(c)) => {
                let cl = &mut s.clients[usize::from(c)];
                if let Phase::Holding { halves, .. } = &cl.phase {
                    for &(shard, token) in halves {
                        s.net.send(Msg::Release { c, shard, token });
                    }
                }
                cl.phase = Phase::Idle;
            }
            Step::Act(Act::Reopen(c)) => {
                let newest = s.published;
                s.clients[usize::from(c)].step = newest;
                if newest == 3 && self.0.plant != Some(Plant::NoWatermark) {
                    // The watermark: a token drawn on the old shard floors
                    // the new one's counter (in the model, at once).
                    let w = s.shards[A].counter + 1;
                    s.shards[A].counter = w;
                    s.shards[B].counter = s.shards[B].counter.max(w) + 1;
                }
            }
            Step::Act(Act::Publish) => {
                s.published += 1;
                if s.published == 3 && self.0.plant == Some(Plant::SkipHandover) {
                    s.published = 4;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("exclusion", |_, s: &State| trusting(s) <= 1),
            Property::always("tokens increase", |_, s: &State| !s.ledger.regressed),
            Property::sometimes("a grant on the new map", |_, s: &State| s.moved),
        ]
    }
}
