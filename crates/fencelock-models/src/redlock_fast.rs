//! The Redlock `crates/fencelock-redlock` implements (`docs/redlock.md`,
//! "The algorithm"): one grant round to every node at once with a token
//! the client proposes from its clock reading; nodes refuse a token not
//! above their counter and floor (`Stale`, with what they have seen), and
//! the client asks again above it; the first majority of grants or of one
//! other holder decides; the arbiter (the first node that voted) decides
//! a split; late grants are undone; a node that timed out is skipped; the
//! probe round (`fresh_top`) only when the client has no clock reading or
//! met a node that lost its data, which it forms by the marker rules of
//! [`crate::redlock`].
//!
//! Written from `acquire.rs`, `backend.rs`, `fanout.rs` and the `GRANT`
//! and `JOIN` scripts of `scripts.rs`; each function names the code it
//! follows.

use stateright::{Model, Property};

use crate::{
    common::{majority, release, world_steps, Held, Id, Step, Tick, Token},
    plant::Plant,
    redlock::{self, bit, Form, Holder, Node, System, TIME_SCALE},
};

/// What is checked, and how far.
#[derive(Clone, Debug)]
pub struct Config {
    /// The nodes, clients, time, probe losses, clock rates and planted
    /// bug, as [`crate::redlock`] bounds them.
    pub base: redlock::Config,
    /// Grant rounds of one acquisition (`ROUNDS`, 8 in the code).
    pub rounds: u8,
    /// Probes of one `fresh_top` (`PROBES`, 5 in the code).
    pub probes: u8,
    /// How many clients (the first ones) start with a clock reading, so
    /// that their first acquisition needs no probe (as every one after an
    /// answer); the others probe first, as a new `RedlockBackend` does.
    pub knowing: usize,
    /// A holder may release its lease (else its lease ends with time).
    pub releases: bool,
    /// A client's clock estimate stays at its last reading instead of
    /// following the nodes' clocks: the lowest of the lower bounds the
    /// code's estimate (`reading + elapsed − elapsed/100`) can be, as when
    /// the client's clock runs slower than the nodes' or its reading came
    /// from a node whose clock is behind the others. Safety must not rest
    /// on the estimate; with it exact, a token is never below the nodes'
    /// clocks and the rejoin floor is never needed.
    pub lagging_clocks: bool,
    /// A restart keeps the node's marker and loses its lease and what its
    /// counter and `hwm` gained since it was formed: AOF with `appendfsync
    /// everysec`, whose last second is lost while the marker, written long
    /// before, survives. Such a node votes at once. (Else a restart loses
    /// everything: no persistence.)
    pub stale_restarts: bool,
    /// Every node starts without its marker: a set never formed, which
    /// the first clients form by the marker rules.
    pub unformed_start: bool,
    /// How far one node's clock may step forward, once in a run (0: no
    /// step): the leases and quarantine it runs end that much earlier.
    pub clock_step: Tick,
    /// The step goes back instead: the lease and quarantine the node
    /// runs end that much later, and its TIME (the tokens' clock) reads
    /// that much lower from then on. Client clocks never step (the guard
    /// runs on the monotonic clock).
    pub clock_step_back: bool,
    /// A scenario: every path begins with these steps, each the first
    /// possible step the function accepts, so that a bound reaches a deep
    /// situation (a rejoined node's quarantine ending) without exploring
    /// every interleaving before it.
    pub prefix: Vec<Wanted>,
}

impl Config {
    /// The bound `cargo test` checks: 3 nodes (clocks fast), 2 clients
    /// with one acquisition each and a clock reading, one restart, no
    /// tick, 1 round, 1 probe, probes answered, no release (see
    /// `docs/safety.md` for why this bound is small).
    pub fn small() -> Self {
        Self {
            base: redlock::Config::small(),
            rounds: 1,
            probes: 1,
            knowing: 2,
            releases: false,
            lagging_clocks: false,
            stale_restarts: false,
            unformed_start: false,
            clock_step: 0,
            clock_step_back: false,
            prefix: Vec::new(),
        }
    }
}

/// A step of a scenario's prefix: whether it is the one wanted.
pub type Wanted = fn(&Step<Msg, Act>) -> bool;

/// What a node answers to a grant (`Answer` in `backend.rs`).
#[allow(missing_docs)] // as in the code
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    Granted,
    /// Held by this owner with this token.
    Held(Id, Token),
    Unformed,
    Quarantined,
    /// The token was not above the counter or floor; what the probe would
    /// answer.
    Stale(Token),
}

/// Messages between clients and nodes. A request's answer travels with
/// its delivery, or is lost with it (see `docs/safety.md`).
#[allow(missing_docs)] // c: client, a: its acquisition, r: round, n: node, t: token
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// The `JOIN` script, from a probe.
    Mark { n: Id, floor: Token, rule: Form },
    /// The `GRANT` script; `replace`, the token this acquisition sent this
    /// node before.
    Grant {
        c: Id,
        a: u8,
        r: u8,
        n: Id,
        t: Token,
        replace: Option<Token>,
    },
    /// A release (of an undo, or of the lease).
    Release { c: Id, n: Id, t: Token },
}

/// What this acquisition may have left on one node (`Copy` in
/// `acquire.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Copy {
    /// Nothing.
    None,
    /// Granted with this token.
    Held(Token),
    /// Asked with this token, outcome not known.
    Unknown(Token),
}

impl Copy {
    fn token(self) -> Option<Token> {
        match self {
            Copy::None => None,
            Copy::Held(t) | Copy::Unknown(t) => Some(t),
        }
    }
}

/// How a node voted in this round (`Vote` in `acquire.rs`).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vote {
    Mine,
    Other(Id, Token),
    Stale(Token),
}

/// One node in the client's acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    copy: Copy,
    vote: Option<Vote>,
    /// The round of the request under way, waited for.
    pending: Option<u8>,
}

/// A request still under way when its acquisition was decided: its late
/// answer is undone (`clean_up`'s `late`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Late {
    a: u8,
    r: u8,
    n: Id,
    /// The copy to release if it was granted (none: the kept lease's).
    undo: Option<Token>,
}

/// A client's acquisition.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring.
    Idle,
    /// `fresh_top` before the first round; `tries` probes left.
    Probing { tries: u8 },
    /// The grant rounds.
    Granting {
        t: Token,
        round: u8,
        slots: Vec<Slot>,
        /// An `Unformed` answer this round / this acquisition.
        unformed_now: bool,
        unformed: bool,
        healed: bool,
        /// A `Stale` answer made it ask again with a higher token.
        raised: bool,
        /// `fresh_top` between rounds, with its probes left.
        probing: Option<u8>,
    },
    /// Granted; trusted while `now < trust_end`.
    Holding { t: Token, trust_end: Tick },
}

/// A client (one `RedlockBackend`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    attempts_left: u8,
    attempt: u8,
    /// When the call began (the guard's `t_sent`) and when the rounds
    /// began (`started`, after the first probe: the validity window).
    called: Tick,
    started: Tick,
    /// The highest completed grant when this acquisition began (I2).
    seen: Token,
    /// When it last read a node's clock, if ever: its estimate is then
    /// `now × TIME_SCALE` (node clocks read alike in the model), or the
    /// reading's with `lagging_clocks`.
    reading: Option<Tick>,
    /// The highest token it proposed (`Inner::last`).
    last: Token,
    /// Nodes skipped (`Health`: a failed request), until the next tick.
    down: u8,
    late: Vec<Late>,
    phase: Phase,
}

impl Holder for Client {
    fn trusts(&self, now: Tick) -> bool {
        matches!(self.phase, Phase::Holding { trust_end, .. } if now < trust_end)
    }
}

/// The whole system.
pub type State = System<Client, Msg, Extra>;

/// What this model records beside the nodes and clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Extra {
    /// A node's clock stepped (once at most).
    stepped: bool,
    /// Some grant completed after a `Stale` answer made its client ask
    /// again (liveness sanity: the round that reads the floor).
    granted_after_stale: bool,
    /// A node voted after a quarantine ended (liveness sanity: the bound
    /// reaches the end of a rejoin).
    rejoined_voted: bool,
}

/// Steps of the clients and nodes themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Client `c` calls `try_acquire`.
    Start(Id),
    /// Client `c` probes; the nodes of the mask answer.
    Probe(Id, u8),
    /// Client `c`'s requests under way time out (`node_timeout`).
    Timeout(Id),
    /// Client `c` releases its lease.
    Release(Id),
    /// Node `n` restarts without persistence.
    Restart(Id),
    /// Node `n`'s clock steps forward (or back) by `clock_step`.
    ClockStep(Id),
}

/// How a `fresh_top` probe ended.
enum Probed {
    /// Probe again (nodes were just formed as a new set, or another
    /// client may be forming them).
    Again,
    /// Too few formed nodes answered.
    Failed,
    /// The highest `top` of a majority of formed nodes.
    Top(Token),
}

/// How an acquisition's rounds ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Won,
    Lost,
}

/// The model.
#[derive(Clone, Debug)]
pub struct RedlockFast(pub Config);

impl RedlockFast {
    fn quorum(&self) -> usize {
        if self.0.base.plant == Some(Plant::QuorumOfOne) {
            return 1;
        }
        majority(self.0.base.nodes)
    }

    fn all(&self) -> u8 {
        ((1u16 << self.0.base.nodes) - 1) as u8
    }

    /// `Health::targets`: the nodes not skipped, or every node while
    /// fewer than a majority is up.
    fn targets(&self, down: u8) -> u8 {
        let up = (0..self.0.base.nodes)
            .filter(|&i| down & bit(i) == 0)
            .count();
        if up < self.quorum() {
            self.all()
        } else {
            self.all() & !down
        }
    }

    /// `Inner::propose`: at least `at_least`, above every token proposed.
    fn propose(cl: &mut Client, at_least: Token) -> Token {
        let t = at_least.max(cl.last + 1);
        cl.last = t;
        t
    }

    /// The `GRANT` script.
    fn grant(&self, node: &mut Node, now: Tick, c: Id, t: Token, replace: Option<Token>) -> Reply {
        if !node.formed {
            return Reply::Unformed;
        }
        if now < node.votes_from && self.0.base.plant != Some(Plant::GrantIgnoresQuarantine) {
            return Reply::Quarantined;
        }
        let seen = node.counter.max(node.floor);
        let mut refresh = false;
        if let Some(l) = node.lease {
            if replace.is_none_or(|r| l.owner != c || l.token != r) {
                return Reply::Held(l.owner, l.token);
            }
            refresh = replace == Some(t);
        }
        if !refresh {
            let stale = match self.0.base.plant {
                Some(Plant::NoTokenCheck) => false,
                Some(Plant::TokenCheckOffByOne) => seen > t,
                _ => seen >= t,
            };
            if stale {
                return Reply::Stale(seen.max(node.time(now)));
            }
            node.counter = t;
            node.hwm = node.hwm.max(t);
        }
        node.lease = Some(Held {
            owner: c,
            token: t,
            end: self.0.base.timing.lease_end(now, node.rate),
        });
        Reply::Granted
    }

    /// One probe of `fresh_top` with its `heal`, answered by the nodes of
    /// `answering` among the client's targets. Sets the client's clock
    /// reading.
    fn probe(&self, s: &mut State, c: Id, answering: u8) -> Probed {
        let n = self.0.base.nodes;
        let asked = self.targets(s.clients[usize::from(c)].down) & answering;
        let now = s.now;
        let answered: Vec<usize> = (0..n).filter(|&i| asked & bit(i) != 0).collect();
        if !answered.is_empty() {
            s.clients[usize::from(c)].reading = Some(s.now);
        }
        let formed: Vec<&Node> = answered
            .iter()
            .map(|&i| &s.nodes[i])
            .filter(|node| node.formed)
            .collect();
        let unformed: Vec<usize> = answered
            .iter()
            .copied()
            .filter(|&i| !s.nodes[i].formed)
            .collect();
        let highest = formed.iter().map(|node| node.hwm).max().unwrap_or(0);
        let top = formed
            .iter()
            .map(|node| node.counter.max(node.floor).max(node.time(now)))
            .max()
            .unwrap_or(0);
        let q = self.quorum();
        let (formed_count, answered_count) = (formed.len(), answered.len());
        // `heal`.
        let rule = if unformed.is_empty() {
            None
        } else if unformed.len() == n
            || (formed_count >= q
                && self.0.base.plant == Some(Plant::FreshJoin)
                && formed.iter().all(|node| node.hwm == 0))
        {
            Some((Form::New, 0))
        } else if formed_count >= q {
            // Above every token a grant that completed can carry: a
            // majority of formed nodes has seen each.
            let floor = if self.0.base.plant == Some(Plant::RejoinFloorZero) {
                0
            } else {
                highest
            };
            Some((Form::Rejoin, floor))
        } else if answered_count == n {
            // The 4 × `node_timeout` wait for a set being formed is not
            // modelled: re-forming at once is the step that can harm.
            Some((Form::Reform, highest))
        } else {
            None
        };
        if let Some((rule, floor)) = rule {
            for &i in &unformed {
                s.net.send(Msg::Mark {
                    n: i as Id,
                    floor,
                    rule,
                });
            }
            if rule == Form::New {
                return Probed::Again;
            }
        }
        if formed_count < q && formed_count < answered_count {
            return Probed::Again;
        }
        if formed_count < q {
            return Probed::Failed;
        }
        Probed::Top(top)
    }

    /// A probe whose outcome is not used: the background `fresh_top`
    /// that forms a node met after the decision (one probe, every node
    /// asked answering).
    fn background_probe(&self, s: &mut State, c: Id) {
        let _ = self.probe(s, c, self.all());
    }

    /// Begins the rounds with token `t` (after the clock estimate or the
    /// first probe).
    fn begin(&self, s: &mut State, c: Id, at_least: Token) {
        let now = s.now;
        let cl = &mut s.clients[usize::from(c)];
        let t = Self::propose(cl, at_least);
        cl.started = now;
        cl.phase = Phase::Granting {
            t,
            round: 0,
            slots: vec![
                Slot {
                    copy: Copy::None,
                    vote: None,
                    pending: None,
                };
                self.0.base.nodes
            ],
            unformed_now: false,
            unformed: false,
            healed: false,
            raised: false,
            probing: None,
        };
        self.round(s, c);
    }

    /// One round: a grant to every target that does not hold this token
    /// yet; decides at once if nothing was sent.
    fn round(&self, s: &mut State, c: Id) {
        let targets = self.targets(s.clients[usize::from(c)].down);
        let cl = &mut s.clients[usize::from(c)];
        let a = cl.attempt;
        if matches!(cl.phase, Phase::Granting { round, .. } if round >= self.0.rounds) {
            self.decide(s, c, None);
            return;
        }
        let Phase::Granting {
            t,
            round,
            slots,
            unformed_now,
            ..
        } = &mut cl.phase
        else {
            return;
        };
        *round += 1;
        *unformed_now = false;
        let mut sent = false;
        for (i, slot) in slots.iter_mut().enumerate() {
            if targets & bit(i) != 0 && slot.pending.is_none() && slot.copy != Copy::Held(*t) {
                let replace = slot.copy.token();
                slot.copy = Copy::Unknown(*t);
                slot.pending = Some(*round);
                sent = true;
                s.net.send(Msg::Grant {
                    c,
                    a,
                    r: *round,
                    n: i as Id,
                    t: *t,
                    replace,
                });
            }
            slot.vote = (slot.copy == Copy::Held(*t)).then_some(Vote::Mine);
        }
        if !sent {
            self.round_end(s, c);
        }
    }

    /// A node's answer to this client.
    fn answer(&self, s: &mut State, c: Id, a: u8, r: u8, n: Id, reply: Reply) {
        let q = self.quorum();
        let i = usize::from(n);
        let cl = &mut s.clients[usize::from(c)];
        let current = cl.attempt == a
            && matches!(&cl.phase, Phase::Granting { slots, .. } if slots[i].pending == Some(r));
        if !current {
            // A late answer: undone if it granted; a node that lost its
            // data is formed. An answer to a request that timed out is
            // not read.
            let Some(at) = cl.late.iter().position(|l| (l.a, l.r, l.n) == (a, r, n)) else {
                return;
            };
            let late = cl.late.remove(at);
            cl.down &= !bit(i);
            match reply {
                Reply::Granted => {
                    if let Some(t) = late.undo {
                        s.net.send(Msg::Release { c, n, t });
                    }
                }
                Reply::Unformed => self.background_probe(s, c),
                _ => {}
            }
            return;
        }
        cl.down &= !bit(i);
        let Phase::Granting {
            t,
            slots,
            unformed_now,
            unformed,
            ..
        } = &mut cl.phase
        else {
            return;
        };
        let slot = &mut slots[i];
        slot.pending = None;
        match reply {
            Reply::Granted => {
                slot.copy = Copy::Held(slot.copy.token().unwrap_or_default());
                slot.vote = Some(Vote::Mine);
            }
            other => {
                slot.copy = Copy::None;
                match other {
                    Reply::Held(o, t) => slot.vote = Some(Vote::Other(o, t)),
                    Reply::Stale(top) => slot.vote = Some(Vote::Stale(top)),
                    Reply::Unformed => {
                        *unformed_now = true;
                        *unformed = true;
                    }
                    _ => {}
                }
            }
        }
        let granted = slots.iter().filter(|x| x.copy == Copy::Held(*t)).count();
        if granted >= q {
            self.decide(s, c, Some(Outcome::Won));
        } else if majority_holder(slots, q) {
            self.decide(s, c, Some(Outcome::Lost));
        } else if slots.iter().all(|x| x.pending.is_none()) {
            self.round_end(s, c);
        }
    }

    /// Every node asked has answered or timed out: the validity window,
    /// then the heal probe, then the arbiter.
    fn round_end(&self, s: &mut State, c: Id) {
        let cl = &mut s.clients[usize::from(c)];
        if !self.0.base.timing.still_valid(cl.started, s.now) {
            self.decide(s, c, None);
            return;
        }
        if let Phase::Granting {
            unformed_now,
            healed,
            probing,
            ..
        } = &mut cl.phase
        {
            if *unformed_now && !*healed {
                *healed = true;
                *probing = Some(self.0.probes);
                return;
            }
        }
        self.arbiter(s, c);
    }

    /// The arbiter's decision, after the heal probe if any.
    fn arbiter(&self, s: &mut State, c: Id) {
        let q = self.quorum();
        let cl = &mut s.clients[usize::from(c)];
        let Phase::Granting { t, slots, .. } = &cl.phase else {
            return;
        };
        let t = *t;
        let votes: Vec<Vote> = slots.iter().filter_map(|x| x.vote).collect();
        match votes.first() {
            Some(Vote::Other(..)) => return self.decide(s, c, Some(Outcome::Lost)),
            None => return self.decide(s, c, None),
            Some(_) => {}
        }
        if votes.len() < q {
            return self.decide(s, c, None);
        }
        let stale = votes
            .iter()
            .filter_map(|v| match v {
                Vote::Stale(top) => Some(*top),
                _ => None,
            })
            .max();
        if let Some(top) = stale {
            let t = Self::propose(cl, top.max(t) + 1);
            if let Phase::Granting {
                t: token, raised, ..
            } = &mut cl.phase
            {
                *token = t;
                *raised = true;
            }
        }
        // Else the arbiter is ours or free: ask again after the backoff
        // (its time is any time the network lets pass).
        self.round(s, c);
    }

    /// A probe of the heal between rounds.
    fn heal_probe(&self, s: &mut State, c: Id, answering: u8) {
        let probed = self.probe(s, c, answering);
        let cl = &mut s.clients[usize::from(c)];
        let Phase::Granting { t, probing, .. } = &mut cl.phase else {
            return;
        };
        let t = *t;
        let left = probing.take().unwrap_or_default();
        match probed {
            Probed::Top(top) => {
                let t = Self::propose(cl, top.max(t) + 1);
                if let Phase::Granting { t: token, .. } = &mut cl.phase {
                    *token = t;
                }
                self.round(s, c);
            }
            Probed::Again if left > 1 => {
                if let Phase::Granting { probing, .. } = &mut cl.phase {
                    *probing = Some(left - 1);
                }
            }
            _ => self.arbiter(s, c),
        }
    }

    /// Ends the acquisition (`outcome` `None`: the rounds ran out, or no
    /// majority can vote): keeps the lease iff won within the validity
    /// window, and `clean_up`s every other copy.
    fn decide(&self, s: &mut State, c: Id, outcome: Option<Outcome>) {
        let now = s.now;
        let (timing, plant) = (self.0.base.timing, self.0.base.plant);
        // The guard's window runs on the client's monotonic clock, which
        // no node's clock step moves.
        let read_late = if plant == Some(Plant::TrustOnNodeClock) {
            s.nodes.iter().map(|node| node.behind).max().unwrap_or(0)
        } else {
            0
        };
        let cl = &mut s.clients[usize::from(c)];
        let a = cl.attempt;
        let Phase::Granting {
            t,
            slots,
            unformed,
            healed,
            raised,
            ..
        } = &cl.phase
        else {
            return;
        };
        let raised = *raised;
        let won = outcome == Some(Outcome::Won) && timing.still_valid(cl.started, now);
        let kept = won.then_some(*t);
        for (i, slot) in slots.iter().enumerate() {
            let undo = slot.copy.token().filter(|&x| Some(x) != kept);
            match slot.pending {
                Some(r) => cl.late.push(Late {
                    a,
                    r,
                    n: i as Id,
                    undo,
                }),
                None => {
                    if let Some(t) = undo {
                        s.net.send(Msg::Release { c, n: i as Id, t });
                    }
                }
            }
        }
        cl.late.sort();
        let (t, heal) = (*t, *unformed && !*healed);
        cl.phase = match kept {
            Some(t) => Phase::Holding {
                t,
                trust_end: timing.trust_end(cl.called + read_late, plant),
            },
            None => Phase::Idle,
        };
        if heal {
            self.background_probe(s, c);
        }
        if won {
            let seen = s.clients[usize::from(c)].seen;
            s.granted(&self.0.base, seen, t);
            s.extra.granted_after_stale |= raised;
        }
    }
}

impl RedlockFast {
    /// `s` after the scenario's prefix. A prefix step that is not
    /// possible is a scenario that does not fit the model: it panics
    /// rather than check a bound that is not the one described.
    fn after_prefix(&self, mut s: State) -> State {
        for (i, wanted) in self.0.prefix.iter().enumerate() {
            let mut steps = Vec::new();
            self.actions(&s, &mut steps);
            let step = steps
                .into_iter()
                .find(wanted)
                .unwrap_or_else(|| panic!("step {i} of the prefix is not possible in {s:?}"));
            s = self
                .next_state(&s, step)
                .expect("every step has a next state");
        }
        s
    }
}

/// `majority_holder` in `acquire.rs`: a majority reports the same other
/// holder.
fn majority_holder(slots: &[Slot], q: usize) -> bool {
    slots.iter().filter_map(|x| x.vote).any(|v| {
        matches!(v, Vote::Other(..)) && slots.iter().filter(|x| x.vote == Some(v)).count() >= q
    })
}

impl Model for RedlockFast {
    type State = State;
    type Action = Step<Msg, Act>;

    fn init_states(&self) -> Vec<State> {
        let node = if self.0.unformed_start {
            Node::empty
        } else {
            Node::formed
        };
        State::initial(&self.0.base, node, |i| Client {
            attempts_left: self.0.base.attempts,
            attempt: 0,
            called: 0,
            started: 0,
            seen: 0,
            reading: (i < self.0.knowing).then_some(0),
            last: 0,
            down: 0,
            late: Vec::new(),
            phase: Phase::Idle,
        })
        .into_iter()
        .map(|s| self.after_prefix(s))
        .collect()
    }

    fn actions(&self, s: &State, steps: &mut Vec<Self::Action>) {
        world_steps(s.now, self.0.base.horizon, &s.net, steps);
        let all = self.all();
        for (i, cl) in s.clients.iter().enumerate() {
            let c = i as Id;
            let probing = match &cl.phase {
                Phase::Idle if cl.attempts_left > 0 => {
                    steps.push(Step::Act(Act::Start(c)));
                    false
                }
                Phase::Probing { .. }
                | Phase::Granting {
                    probing: Some(_), ..
                } => true,
                Phase::Granting { slots, .. } => {
                    if slots.iter().any(|x| x.pending.is_some()) {
                        steps.push(Step::Act(Act::Timeout(c)));
                    }
                    false
                }
                Phase::Holding { .. } => {
                    if self.0.releases {
                        steps.push(Step::Act(Act::Release(c)));
                    }
                    false
                }
                Phase::Idle => false,
            };
            if probing {
                let targets = self.targets(cl.down);
                for answering in 0..=all {
                    if answering & !targets == 0
                        && (self.0.base.probe_losses || answering == targets)
                    {
                        steps.push(Step::Act(Act::Probe(c, answering)));
                    }
                }
            }
        }
        s.restart_steps(Act::Restart, steps);
        if self.0.clock_step > 0 && !s.extra.stepped {
            // Only a node with a lease or a quarantine running: a forward
            // step changes nothing else, and a backward one only the tops
            // the node answers, which the nodes' token check covers (a
            // search with every node took a third more states).
            for (n, node) in s.nodes.iter().enumerate() {
                if node.lease.is_some() || node.votes_from > s.now {
                    steps.push(Step::Act(Act::ClockStep(n as Id)));
                }
            }
        }
    }

    fn next_state(&self, last: &State, step: Self::Action) -> Option<State> {
        let mut s = last.clone();
        match step {
            Step::Tick => {
                s.tick();
                // A skipped node is tried again after at most 250 ms.
                for cl in &mut s.clients {
                    cl.down = 0;
                }
            }
            Step::Deliver(m) => {
                s.net.take(&m);
                let now = s.now;
                match m {
                    Msg::Mark { n, floor, rule } => {
                        s.nodes[usize::from(n)].mark(now, floor, rule, &self.0.base)
                    }
                    Msg::Grant {
                        c,
                        a,
                        r,
                        n,
                        t,
                        replace,
                    } => {
                        let node = &mut s.nodes[usize::from(n)];
                        let reply = self.grant(node, now, c, t, replace);
                        s.extra.rejoined_voted |= reply == Reply::Granted && node.votes_from > 0;
                        self.answer(&mut s, c, a, r, n, reply);
                    }
                    Msg::Release { c, n, t } => release(&mut s.nodes[usize::from(n)].lease, c, t),
                }
            }
            Step::Act(Act::Start(c)) => {
                let (now, seen) = (s.now, s.ledger.highest);
                let cl = &mut s.clients[usize::from(c)];
                cl.attempts_left -= 1;
                cl.attempt += 1;
                cl.called = now;
                cl.seen = seen;
                if let Some(reading) = cl.reading {
                    let estimate = if self.0.lagging_clocks { reading } else { now };
                    self.begin(&mut s, c, Token::from(estimate) * TIME_SCALE + 1);
                } else {
                    cl.phase = Phase::Probing {
                        tries: self.0.probes,
                    };
                }
            }
            Step::Act(Act::Probe(c, answering)) => {
                if let Phase::Probing { tries } = s.clients[usize::from(c)].phase {
                    match self.probe(&mut s, c, answering) {
                        Probed::Top(top) => self.begin(&mut s, c, top + 1),
                        Probed::Again if tries > 1 => {
                            s.clients[usize::from(c)].phase = Phase::Probing { tries: tries - 1 }
                        }
                        _ => s.clients[usize::from(c)].phase = Phase::Idle,
                    }
                } else {
                    self.heal_probe(&mut s, c, answering);
                }
            }
            Step::Act(Act::Timeout(c)) => {
                let cl = &mut s.clients[usize::from(c)];
                if let Phase::Granting { slots, .. } = &mut cl.phase {
                    for (i, slot) in slots.iter_mut().enumerate() {
                        if slot.pending.take().is_some() {
                            cl.down |= bit(i);
                        }
                    }
                }
                self.round_end(&mut s, c);
            }
            Step::Act(Act::Release(c)) => {
                let targets = self.targets(s.clients[usize::from(c)].down);
                let cl = &mut s.clients[usize::from(c)];
                if let Phase::Holding { t, .. } = cl.phase {
                    for n in 0..self.0.base.nodes {
                        if targets & bit(n) != 0 {
                            s.net.send(Msg::Release { c, n: n as Id, t });
                        }
                    }
                }
                cl.phase = Phase::Idle;
            }
            Step::Act(Act::Restart(n)) => s.restart(n, |node| {
                if self.0.stale_restarts {
                    Node {
                        lease: None,
                        counter: node.floor,
                        hwm: node.floor,
                        ..node.clone()
                    }
                } else {
                    node.lost()
                }
            }),
            Step::Act(Act::ClockStep(n)) => {
                let (now, step) = (s.now, self.0.clock_step);
                let node = &mut s.nodes[usize::from(n)];
                if self.0.clock_step_back {
                    // What the node times on its clock lasts longer; its
                    // TIME reads lower, and so do the tops it answers.
                    node.behind = step;
                    if node.votes_from > now {
                        node.votes_from += step;
                    }
                    if let Some(l) = &mut node.lease {
                        l.end += step;
                    }
                } else {
                    if node.votes_from > now {
                        node.votes_from = node.votes_from.saturating_sub(step).max(now);
                    }
                    if let Some(l) = &mut node.lease {
                        l.end = l.end.saturating_sub(step);
                        if l.end <= now {
                            node.lease = None;
                            s.lease_ended = true;
                        }
                    }
                }
                s.extra.stepped = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = redlock::properties();
        properties.extend([
            Property::sometimes("a grant after a stale answer", |_, s: &State| {
                s.extra.granted_after_stale
            }),
            Property::sometimes("a rejoined node's vote", |_, s: &State| {
                s.extra.rejoined_voted
            }),
        ]);
        properties
    }
}
