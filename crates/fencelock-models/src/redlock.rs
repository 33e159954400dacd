//! Redlock with quorum-monotonic tokens (`docs/redlock.md`,
//! `crates/fencelock-redlock`): a probe round, grants asked of an arbiter
//! first and then of the others, the validity window, the marker rules
//! for nodes that lost their data (rejoin with a floor from the formed
//! nodes' `hwm`, re-formation, a new set) and the quarantine `Q` of a node
//! that joins.
//!
//! This is the protocol as it was before the fast Redlock work: a probe
//! before every acquisition, then grants one node at a time until an
//! arbiter granted. [`crate::redlock_fast`] models the one-round grant
//! `crates/fencelock-redlock` implements now; the bound's common part, the
//! nodes with their marker rules and scripts, time, restarts and the
//! properties are shared ([`System`]).

use stateright::{Model, Property};

use crate::{
    common::{
        majority, rate_assignments, release, world_steps, Held, Id, Ledger, Net, Rate, Step, Tick,
        Timing, Token,
    },
    plant::Plant,
};

/// A node's clock read as a token: TIME in µs, here `now × TIME_SCALE`,
/// coarse enough that no bound lets the model grant more tokens in one
/// tick than the clock advances.
pub(crate) const TIME_SCALE: Token = 16;

/// What is checked, and how far: the whole bound of this model, and the
/// part of [`crate::redlock_fast::Config`] that both models read alike.
#[derive(Clone, Debug)]
pub struct Config {
    /// Redis nodes (odd, at least 3).
    pub nodes: usize,
    /// Clients acquiring the one key.
    pub clients: usize,
    /// Acquisitions each client starts.
    pub attempts: u8,
    /// Node restarts without persistence, over the whole run.
    pub restarts: u8,
    /// The last tick of the reference clock explored.
    pub horizon: Tick,
    /// Lease timing.
    pub timing: Timing,
    /// A probe's answer may be lost (else every node asked answers the
    /// probe, and only grants are lost).
    pub probe_losses: bool,
    /// Every node's clock runs fast (the adversarial rate: leases and
    /// quarantines end earliest), instead of every mix of fast and slow.
    pub fast_clocks_only: bool,
    /// A planted bug (the mutation suite's; none in the model).
    #[doc(hidden)]
    pub plant: Option<Plant>,
}

impl Config {
    /// The bound `cargo test` checks: 3 nodes (clocks fast), 2 clients
    /// with one acquisition each, one restart, no tick (no lease ends:
    /// the interleavings of two acquisitions and a restart), probes
    /// answered.
    pub fn small() -> Self {
        Self {
            nodes: 3,
            clients: 2,
            attempts: 1,
            restarts: 1,
            horizon: 0,
            timing: Timing::new(),
            fast_clocks_only: true,
            probe_losses: false,
            plant: None,
        }
    }
}

/// One Redis node: the marker (`formed`, `votes_from`, `floor`, `hwm`) and
/// the key's counter and lease. With one key the counter and `hwm` move
/// together but are kept apart as the code keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub(crate) rate: Rate,
    pub(crate) formed: bool,
    pub(crate) votes_from: Tick,
    pub(crate) floor: Token,
    pub(crate) hwm: Token,
    pub(crate) counter: Token,
    pub(crate) lease: Option<Held>,
    /// How far its clock stepped back (`redlock_fast`'s backward step):
    /// its TIME reads that much lower.
    pub(crate) behind: Tick,
}

impl Node {
    pub(crate) fn formed(rate: Rate) -> Self {
        Self {
            rate,
            formed: true,
            votes_from: 0,
            floor: 0,
            hwm: 0,
            counter: 0,
            lease: None,
            behind: 0,
        }
    }

    pub(crate) fn empty(rate: Rate) -> Self {
        Self {
            formed: false,
            ..Self::formed(rate)
        }
    }

    /// What a restart without persistence leaves: the data is lost, not
    /// the host's clock.
    pub(crate) fn lost(&self) -> Self {
        Self {
            behind: self.behind,
            ..Self::empty(self.rate)
        }
    }

    /// Its clock at reference instant `now`, read as a token (TIME).
    pub(crate) fn time(&self, now: Tick) -> Token {
        Token::from(now.saturating_sub(self.behind)) * TIME_SCALE
    }

    /// The `JOIN` script (`crates/fencelock-redlock/src/scripts.rs`):
    /// forms an unformed node by `rule`, with `floor` from the client's
    /// probe; a formed node is left alone.
    pub(crate) fn mark(&mut self, now: Tick, floor: Token, rule: Form, config: &Config) {
        if self.formed {
            return;
        }
        let q_end = quarantine_end(config.plant, &config.timing, now, self.rate);
        let given = floor;
        let (floor, votes_from) = match rule {
            Form::New => (floor.max(self.time(now)), now),
            Form::Rejoin => (floor, q_end),
            Form::Reform => (floor.max(self.time(q_end)), q_end),
        };
        // `fresh` keeps the given floor as `hwm` (0 from a new set: it has
        // granted nothing), `join` and `reform` the floor they set.
        self.hwm = if rule == Form::New { given } else { floor };
        self.formed = true;
        self.floor = floor;
        self.votes_from = votes_from;
    }
}

/// When a node that joins at `now` votes: `Q = max_ttl·1.01 + 2 ms` on
/// its clock, above `max_ttl` by the drift, so that every lease the node
/// granted before it lost its data has ended on every clock.
pub(crate) fn quarantine_end(plant: Option<Plant>, t: &Timing, now: Tick, rate: Rate) -> Tick {
    if plant == Some(Plant::JoinWithoutQuarantine) {
        return now;
    }
    rate.stretch(now, t.ttl + t.drift, t.drift)
}

/// A probe's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Answer {
    formed: bool,
    top: Token,
    hwm: Token,
}

/// Which marker rule a client applies to an unformed node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    /// Every node answered, none formed: vote at once, floor = own TIME.
    New,
    /// A majority of formed nodes answered: floor = their highest `hwm`.
    Rejoin,
    /// Every node answered, fewer than a majority formed: floor = the
    /// highest `hwm` or own TIME + `Q`, whichever is higher.
    Reform,
}

/// Messages between clients and nodes. `a` is the client's acquisition
/// number, so that late answers to an earlier one are recognised.
#[allow(missing_docs)] // c: client, n: node, t: token, as everywhere here
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// Writes the marker on an unformed node.
    Mark { n: Id, floor: Token, rule: Form },
    /// Grant request for token `t`.
    Grant { c: Id, a: u8, n: Id, t: Token },
    /// Grant answer.
    Granted {
        c: Id,
        a: u8,
        n: Id,
        t: Token,
        ok: bool,
    },
    /// Release of the lease (owner `c`, token `t`).
    Release { c: Id, n: Id, t: Token },
}

/// Where one node stands in a client's round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// Not asked (yet, or skipped).
    No,
    /// Asked, no answer yet.
    Pending,
    /// Answered: granted / probe answer.
    Yes,
    /// Answered: refused.
    Refused,
    /// Gave up on it (`node_timeout`).
    TimedOut,
}

/// A client's acquisition.
#[allow(missing_docs)] // asks/answers per node, t: the token
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring.
    Idle,
    /// Grant round; `arbiter` once some node granted first.
    Granting {
        t: Token,
        asks: Vec<Ask>,
        arbiter: bool,
    },
    /// Granted; trusted while `now < trust_end`.
    Holding {
        t: Token,
        trust_end: Tick,
        asks: Vec<Ask>,
    },
}

/// A client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    attempts_left: u8,
    attempt: u8,
    started: Tick,
    /// The highest completed grant when this acquisition began (I2).
    seen: Token,
    phase: Phase,
}

impl Holder for Client {
    fn trusts(&self, now: Tick) -> bool {
        matches!(self.phase, Phase::Holding { trust_end, .. } if now < trust_end)
    }
}

/// The whole system.
pub type State = System<Client, Msg, ()>;

/// The whole system of either Redlock model: the nodes, time and the
/// ledger alike, the model's own clients `C` and messages `M`, and `E`,
/// what only one of them records for its properties.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct System<C, M, E> {
    pub(crate) now: Tick,
    pub(crate) nodes: Vec<Node>,
    pub(crate) clients: Vec<C>,
    pub(crate) net: Net<M>,
    pub(crate) ledger: Ledger,
    pub(crate) restarts_left: u8,
    /// Some grant completed after the last restart (liveness sanity).
    granted_after_restart: bool,
    /// Some lease ended with time on a node (not by a release).
    pub(crate) lease_ended: bool,
    /// Some grant completed after that (liveness sanity: time hands the
    /// key over).
    granted_after_lease_end: bool,
    pub(crate) extra: E,
}

/// A client as the exclusion property reads it.
pub(crate) trait Holder {
    /// Whether it trusts its lease at `now`.
    fn trusts(&self, now: Tick) -> bool;
}

impl<C, M: Ord + Clone, E: Default> System<C, M, E> {
    /// The initial states: no time passed, nothing in flight, the nodes
    /// `node` makes at every mix of clock rates the bound explores, and
    /// the clients `client` makes of their indices.
    pub(crate) fn initial(
        config: &Config,
        node: fn(Rate) -> Node,
        client: impl Fn(usize) -> C,
    ) -> Vec<Self> {
        rate_assignments(config.nodes)
            .into_iter()
            .filter(|rates| !config.fast_clocks_only || rates.iter().all(|r| *r == Rate::Fast))
            .map(|rates| Self {
                now: 0,
                nodes: rates.into_iter().map(node).collect(),
                clients: (0..config.clients).map(&client).collect(),
                net: Net::new(),
                ledger: Ledger::default(),
                restarts_left: config.restarts,
                granted_after_restart: false,
                lease_ended: false,
                granted_after_lease_end: false,
                extra: E::default(),
            })
            .collect()
    }

    /// One tick of the reference clock: the leases that end then are
    /// free.
    pub(crate) fn tick(&mut self) {
        self.now += 1;
        for node in &mut self.nodes {
            if node.lease.is_some_and(|l| l.end <= self.now) {
                node.lease = None;
                self.lease_ended = true;
            }
        }
    }

    /// Adds a restart of each node while the bound has restarts left.
    pub(crate) fn restart_steps<A>(&self, restart: fn(Id) -> A, steps: &mut Vec<Step<M, A>>) {
        if self.restarts_left > 0 {
            for n in 0..self.nodes.len() {
                steps.push(Step::Act(restart(n as Id)));
            }
        }
    }

    /// Node `n` restarts as `restarted` makes it of what it was.
    pub(crate) fn restart(&mut self, n: Id, restarted: impl FnOnce(&Node) -> Node) {
        let node = &mut self.nodes[usize::from(n)];
        *node = restarted(node);
        self.restarts_left -= 1;
        self.granted_after_restart = false;
    }

    /// Records a grant of `t` to an acquisition that began when `seen`
    /// was the highest completed token.
    pub(crate) fn granted(&mut self, config: &Config, seen: Token, t: Token) {
        self.ledger.complete(seen, t);
        if self.restarts_left < config.restarts {
            self.granted_after_restart = true;
        }
        self.granted_after_lease_end |= self.lease_ended;
    }
}

/// The properties both Redlock models check.
pub(crate) fn properties<S, C, M, E>() -> Vec<Property<S>>
where
    S: Model<State = System<C, M, E>>,
    C: Holder,
{
    vec![
        Property::always("exclusion", |_, s: &System<C, M, E>| {
            s.clients.iter().filter(|c| c.trusts(s.now)).count() <= 1
        }),
        Property::always("tokens increase", |_, s: &System<C, M, E>| {
            !s.ledger.regressed
        }),
        Property::sometimes("a grant", |_, s: &System<C, M, E>| s.ledger.grants > 0),
        Property::sometimes("a grant after a restart", |_, s: &System<C, M, E>| {
            s.granted_after_restart
        }),
        Property::sometimes("a grant after a lease ended", |_, s: &System<C, M, E>| {
            s.granted_after_lease_end
        }),
    ]
}

/// Steps of the clients and nodes themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Client `c` starts an acquisition; the nodes of the mask answer its
    /// probe.
    Start(Id, u8),
    /// Client `c` gives up on the nodes it waits for.
    Timeout(Id),
    /// Client `c` releases what it holds.
    Release(Id),
    /// Node `n` restarts without persistence.
    Restart(Id),
}

/// The model.
#[derive(Clone, Debug)]
pub struct Redlock(pub Config);

/// A node's bit in a mask of nodes.
pub(crate) fn bit(n: usize) -> u8 {
    1 << n
}

impl Redlock {
    fn maj(&self) -> usize {
        majority(self.0.nodes)
    }

    /// A node takes a request; its answer, if any.
    fn node_receives(&self, s: &mut State, msg: Msg) -> Option<Msg> {
        let now = s.now;
        match msg {
            Msg::Mark { n, floor, rule } => {
                s.nodes[usize::from(n)].mark(now, floor, rule, &self.0);
                None
            }
            Msg::Grant { c, a, n, t } => {
                let end = self.0.timing.lease_end(now, s.nodes[usize::from(n)].rate);
                let node = &mut s.nodes[usize::from(n)];
                let ok = node.formed
                    && now >= node.votes_from
                    && (node.lease.is_none() || self.0.plant == Some(Plant::GrantIgnoresLease))
                    && t > node.counter.max(node.floor);
                if ok {
                    node.lease = Some(Held {
                        owner: c,
                        token: t,
                        end,
                    });
                    node.counter = t;
                    node.hwm = node.hwm.max(t);
                }
                Some(Msg::Granted { c, a, n, t, ok })
            }
            Msg::Release { c, n, t } => {
                release(&mut s.nodes[usize::from(n)].lease, c, t);
                None
            }
            Msg::Granted { .. } => None,
        }
    }

    fn client_receives(&self, s: &mut State, msg: Msg) {
        let Msg::Granted { c, a, n, t, ok } = msg else {
            return;
        };
        let cl = &mut s.clients[usize::from(c)];
        let current = cl.attempt == a;
        let mut handled = false;
        if current {
            if let Phase::Granting { asks, .. } = &mut cl.phase {
                if asks[usize::from(n)] == Ask::Pending {
                    asks[usize::from(n)] = if ok { Ask::Yes } else { Ask::Refused };
                    handled = true;
                }
            }
        }
        if handled {
            self.grant_progress(s, c, Some((n, ok)));
        } else if ok {
            // A late grant: part of the lease held with this token
            // (released with it), else given back.
            let holds = matches!(cl.phase, Phase::Holding { t: held, .. } if held == t);
            if !holds {
                s.net.send(Msg::Release { c, n, t });
            }
        }
    }

    /// What node `n` answers to a probe.
    fn probe(&self, s: &State, n: usize) -> Answer {
        let node = &s.nodes[n];
        let time = node.time(s.now);
        Answer {
            formed: node.formed,
            top: if node.formed {
                node.counter.max(node.floor).max(time)
            } else {
                time
            },
            hwm: node.hwm,
        }
    }

    /// Starts an acquisition with its probe round, answered by the nodes
    /// of `answering` (the others time out).
    fn start(&self, s: &mut State, c: Id, answering: u8) {
        let n = self.0.nodes;
        let now = s.now;
        let seen = s.ledger.highest;
        let answers: Vec<Option<Answer>> = (0..n)
            .map(|i| (answering & bit(i) != 0).then(|| self.probe(s, i)))
            .collect();
        let cl = &mut s.clients[usize::from(c)];
        cl.attempts_left -= 1;
        cl.attempt += 1;
        cl.started = now;
        cl.seen = seen;
        self.probed(s, c, &answers);
    }

    /// Decides on the probe round's answers.
    fn probed(&self, s: &mut State, c: Id, answers: &[Option<Answer>]) {
        let formed: Vec<&Answer> = answers.iter().flatten().filter(|a| a.formed).collect();
        let answered = answers.iter().flatten().count();
        let unformed: Vec<Id> = (0..self.0.nodes)
            .filter(|&i| answers[i].is_some_and(|a| !a.formed))
            .map(|i| i as Id)
            .collect();
        let hwm = formed.iter().map(|a| a.hwm).max().unwrap_or(0);
        if formed.len() >= self.maj() {
            let t = formed.iter().map(|a| a.top).max().unwrap_or(0) + 1;
            for n in unformed {
                s.net.send(Msg::Mark {
                    n,
                    floor: hwm,
                    rule: Form::Rejoin,
                });
            }
            self.begin_grants(s, c, t);
            return;
        }
        if answered == self.0.nodes {
            let rule = if formed.is_empty() {
                Form::New
            } else {
                Form::Reform
            };
            for n in unformed {
                s.net.send(Msg::Mark {
                    n,
                    floor: hwm,
                    rule,
                });
            }
        }
        self.fail(s, c);
    }

    fn begin_grants(&self, s: &mut State, c: Id, t: Token) {
        let cl = &mut s.clients[usize::from(c)];
        cl.phase = Phase::Granting {
            t,
            asks: vec![Ask::No; self.0.nodes],
            arbiter: false,
        };
        self.next_arbiter(s, c);
    }

    /// Asks the next node in URL order to be the arbiter; decides when
    /// there is none left.
    fn next_arbiter(&self, s: &mut State, c: Id) {
        let cl = &mut s.clients[usize::from(c)];
        let a = cl.attempt;
        let Phase::Granting { t, asks, .. } = &mut cl.phase else {
            return;
        };
        let next = (0..self.0.nodes).find(|&i| asks[i] == Ask::No);
        match next {
            Some(i) => {
                asks[i] = Ask::Pending;
                s.net.send(Msg::Grant {
                    c,
                    a,
                    n: i as Id,
                    t: *t,
                });
            }
            None => self.fail(s, c),
        }
    }

    /// After an answer (`Some((node, granted))`) or a timeout (`None`).
    fn grant_progress(&self, s: &mut State, c: Id, answer: Option<(Id, bool)>) {
        let cl = &mut s.clients[usize::from(c)];
        let a = cl.attempt;
        let Phase::Granting { t, asks, arbiter } = &mut cl.phase else {
            return;
        };
        let t = *t;
        if !*arbiter {
            if answer.is_some_and(|(_, ok)| ok) {
                *arbiter = true;
                for (i, ask) in asks.iter_mut().enumerate() {
                    if *ask == Ask::No {
                        *ask = Ask::Pending;
                        s.net.send(Msg::Grant {
                            c,
                            a,
                            n: i as Id,
                            t,
                        });
                    }
                }
            } else {
                self.next_arbiter(s, c);
                return;
            }
        }
        let Phase::Granting { asks, .. } = &s.clients[usize::from(c)].phase else {
            return;
        };
        let yes = asks.iter().filter(|a| **a == Ask::Yes).count();
        let pending = asks.iter().filter(|a| **a == Ask::Pending).count();
        let maj = self.maj();
        if pending > 0 {
            return;
        }
        let cl = &s.clients[usize::from(c)];
        if yes >= maj && self.0.timing.still_valid(cl.started, s.now) {
            let trust_end = self.0.timing.trust_end(cl.started, self.0.plant);
            let seen = cl.seen;
            let asks = match &cl.phase {
                Phase::Granting { asks, .. } => asks.clone(),
                _ => Vec::new(),
            };
            s.clients[usize::from(c)].phase = Phase::Holding { t, trust_end, asks };
            s.granted(&self.0, seen, t);
        } else {
            self.fail(s, c);
        }
    }

    /// Ends the acquisition unsuccessfully, releasing every lease it may
    /// have made.
    fn fail(&self, s: &mut State, c: Id) {
        let cl = &mut s.clients[usize::from(c)];
        if let Phase::Granting { t, asks, .. } = &cl.phase {
            for (i, ask) in asks.iter().enumerate() {
                if *ask != Ask::No && *ask != Ask::Refused {
                    s.net.send(Msg::Release {
                        c,
                        n: i as Id,
                        t: *t,
                    });
                }
            }
        }
        cl.phase = Phase::Idle;
    }

    fn timeout(&self, s: &mut State, c: Id) {
        let cl = &mut s.clients[usize::from(c)];
        let Phase::Granting { asks, .. } = &mut cl.phase else {
            return;
        };
        for ask in asks.iter_mut() {
            if *ask == Ask::Pending {
                *ask = Ask::TimedOut;
            }
        }
        self.grant_progress(s, c, None);
    }
}

fn waiting(phase: &Phase) -> bool {
    match phase {
        Phase::Granting { asks, .. } => asks.contains(&Ask::Pending),
        _ => false,
    }
}

impl Model for Redlock {
    type State = State;
    type Action = Step<Msg, Act>;

    fn init_states(&self) -> Vec<State> {
        State::initial(&self.0, Node::formed, |_| Client {
            attempts_left: self.0.attempts,
            attempt: 0,
            started: 0,
            seen: 0,
            phase: Phase::Idle,
        })
    }

    fn actions(&self, s: &State, steps: &mut Vec<Self::Action>) {
        world_steps(s.now, self.0.horizon, &s.net, steps);
        for (i, c) in s.clients.iter().enumerate() {
            let c_id = i as Id;
            match c.phase {
                Phase::Idle if c.attempts_left > 0 => {
                    // The probe round is one step: each node answers from
                    // its state now, or its answer is lost.
                    let all = (1u8 << self.0.nodes) - 1;
                    for answering in 0..=all {
                        if self.0.probe_losses || answering == all {
                            steps.push(Step::Act(Act::Start(c_id, answering)));
                        }
                    }
                }
                Phase::Holding { .. } => steps.push(Step::Act(Act::Release(c_id))),
                ref p if waiting(p) => steps.push(Step::Act(Act::Timeout(c_id))),
                _ => {}
            }
        }
        s.restart_steps(Act::Restart, steps);
    }

    fn next_state(&self, last: &State, step: Self::Action) -> Option<State> {
        let mut s = last.clone();
        match step {
            Step::Tick => s.tick(),
            Step::Deliver(m) => {
                s.net.take(&m);
                if let Some(answer) = self.node_receives(&mut s, m) {
                    self.client_receives(&mut s, answer);
                }
            }
            Step::Act(Act::Start(c, answering)) => self.start(&mut s, c, answering),
            Step::Act(Act::Timeout(c)) => self.timeout(&mut s, c),
            Step::Act(Act::Release(c)) => {
                let cl = &mut s.clients[usize::from(c)];
                if let Phase::Holding { t, ref asks, .. } = cl.phase {
                    // Every node that may hold the lease: a release on
                    // the others finds nothing.
                    for (n, ask) in asks.iter().enumerate() {
                        if !matches!(ask, Ask::No | Ask::Refused) {
                            s.net.send(Msg::Release { c, n: n as Id, t });
                        }
                    }
                }
                cl.phase = Phase::Idle;
            }
            Step::Act(Act::Restart(n)) => s.restart(n, Node::lost),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties()
    }
}
