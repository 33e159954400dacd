//! Election hand-over (`docs/election.md`, `docs/semantics.md` I5): the
//! leader is the holder of the election's key, its term the lease's
//! token, and it leads only inside the trust window of its last confirmed
//! grant or renewal, `t_sent + ttl·(1 − drift) − margin`.
//!
//! Candidates campaign, renew, resign, crash and come back as a new owner;
//! the store's clock drifts; requests and answers are lost, delayed and
//! reordered. The store keeps its data (the backends that persist).

use stateright::{Model, Property};

use crate::{
    common::{rate_assignments, world_steps, Id, Ledger, Net, Step, Store, Tick, Timing, Token},
    plant::Plant,
};

/// What is checked, and how far.
#[derive(Clone, Debug)]
pub struct Config {
    /// Candidates.
    pub candidates: usize,
    /// Requests (campaigns and renewals) each candidate sends, over all
    /// its lives.
    pub requests: u8,
    /// Candidate crashes, over the whole run.
    pub crashes: u8,
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
            candidates: 2,
            requests: 2,
            crashes: 0,
            horizon: 4,
            timing: Timing::new(),
            plant: None,
        }
    }
}

/// Requests and answers; `o` is the candidate's owner name (candidate and
/// life), `r` the request's number.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Campaign { o: Id, r: u8 },
    Elected { o: Id, r: u8, term: Option<Token> },
    Renew { o: Id, r: u8, term: Token },
    Renewed { o: Id, r: u8, ok: bool },
    Resign { o: Id, term: Token },
}

/// A candidate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    life: u8,
    requests_left: u8,
    /// The request in flight: number and send time.
    pending: Option<(u8, Tick)>,
    /// The term it leads and the end of its trust window.
    leads: Option<(Token, Tick)>,
    /// The highest completed term when its campaign began (I2).
    seen: Token,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: Tick,
    store: Store,
    candidates: Vec<Candidate>,
    net: Net<Msg>,
    ledger: Ledger,
    crashes_left: u8,
    /// A renewal extended some leadership (liveness sanity).
    renewed: bool,
}

/// A candidate's own steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Campaigns (not leading, nothing in flight).
    Campaign(Id),
    /// Renews its leadership.
    Renew(Id),
    /// Gives up waiting for an answer.
    Timeout(Id),
    /// Resigns.
    Resign(Id),
    /// Crashes and comes back as a new owner, leading nothing.
    Crash(Id),
}

/// The model.
#[derive(Clone, Debug)]
pub struct Election(pub Config);

impl Election {
    fn owner(&self, c: usize, life: u8) -> Id {
        (usize::from(life) * self.0.candidates + c) as Id
    }

    fn of(&self, o: Id) -> (usize, u8) {
        let o = usize::from(o);
        (o % self.0.candidates, (o / self.0.candidates) as u8)
    }

    fn send_request(&self, s: &mut State, c: usize, msg: impl FnOnce(Id, u8) -> Msg) {
        let now = s.now;
        let cand = &mut s.candidates[c];
        cand.requests_left -= 1;
        let r = self.0.requests - cand.requests_left;
        cand.pending = Some((r, now));
        let o = self.owner(c, cand.life);
        s.net.send(msg(o, r));
    }

    fn deliver(&self, s: &mut State, msg: Msg) {
        let now = s.now;
        let (t, plant) = (self.0.timing, self.0.plant);
        match msg {
            Msg::Campaign { o, r } => {
                s.store.expire(now, plant);
                let term = s.store.acquire(o, 0, now, &t, plant);
                s.net.send(Msg::Elected { o, r, term });
            }
            Msg::Renew { o, r, term } => {
                s.store.expire(now, plant);
                let ok = s.store.renew(o, term, now, &t);
                s.net.send(Msg::Renewed { o, r, ok });
            }
            Msg::Resign { o, term } => s.store.release(o, term),
            Msg::Elected { o, r, term } => {
                let (c, life) = self.of(o);
                let cand = &mut s.candidates[c];
                let Some((sent, term)) = cand
                    .pending
                    .filter(|(p, _)| cand.life == life && *p == r)
                    .map(|(_, sent)| sent)
                    .zip(term)
                else {
                    let current =
                        cand.life == life && cand.leads.is_some_and(|(t, _)| Some(t) == term);
                    if let (Some(term), false) = (term, current) {
                        // A grant nobody waits for any more: given back.
                        s.net.send(Msg::Resign { o, term });
                    }
                    if cand.life == life && cand.pending.is_some_and(|(p, _)| p == r) {
                        cand.pending = None;
                    }
                    return;
                };
                cand.pending = None;
                let end = t.trust_end(sent, plant);
                if now < end {
                    cand.leads = Some((term, end));
                    let seen = cand.seen;
                    s.ledger.complete(seen, term);
                } else {
                    // Too late to trust: given back.
                    s.net.send(Msg::Resign { o, term });
                }
            }
            Msg::Renewed { o, r, ok } => {
                let (c, life) = self.of(o);
                let cand = &mut s.candidates[c];
                let Some((_, sent)) = cand.pending.filter(|(p, _)| cand.life == life && *p == r)
                else {
                    return;
                };
                cand.pending = None;
                // The window runs from the request: the store may have
                // extended the lease long before this answer arrived.
                let from = if plant == Some(Plant::RenewalTrustedFromAnswer) {
                    now
                } else {
                    sent
                };
                match (ok, cand.leads) {
                    (true, Some((term, _))) => {
                        cand.leads = Some((term, t.trust_end(from, plant)));
                        s.renewed = true;
                    }
                    _ => cand.leads = None,
                }
            }
        }
    }
}

fn leading(s: &State) -> usize {
    s.candidates
        .iter()
        .filter(|c| c.leads.is_some_and(|(_, end)| s.now < end))
        .count()
}

impl Model for Election {
    type State = State;
    type Action = Step<Msg, Act>;

    fn init_states(&self) -> Vec<State> {
        rate_assignments(1)
            .into_iter()
            .map(|rates| State {
                now: 0,
                store: Store::new(rates[0]),
                candidates: vec![
                    Candidate {
                        life: 0,
                        requests_left: self.0.requests,
                        pending: None,
                        leads: None,
                        seen: 0,
                    };
                    self.0.candidates
                ],
                net: Net::new(),
                ledger: Ledger::default(),
                crashes_left: self.0.crashes,
                renewed: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, steps: &mut Vec<Self::Action>) {
        world_steps(s.now, self.0.horizon, &s.net, steps);
        for (i, c) in s.candidates.iter().enumerate() {
            let id = i as Id;
            match (c.pending, c.leads) {
                (Some(_), _) => steps.push(Step::Act(Act::Timeout(id))),
                (None, None) if c.requests_left > 0 => steps.push(Step::Act(Act::Campaign(id))),
                (None, Some(_)) => {
                    if c.requests_left > 0 {
                        steps.push(Step::Act(Act::Renew(id)));
                    }
                    steps.push(Step::Act(Act::Resign(id)));
                }
                _ => {}
            }
            if s.crashes_left > 0 {
                steps.push(Step::Act(Act::Crash(id)));
            }
        }
    }

    fn next_state(&self, last: &State, step: Self::Action) -> Option<State> {
        let mut s = last.clone();
        match step {
            Step::Tick => {
                s.now += 1;
                let now = s.now;
                s.store.expire(now, self.0.plant);
                for c in &mut s.candidates {
                    // A leader whose window ended knows it lost (I5).
                    if c.leads.is_some_and(|(_, end)| end <= now) {
                        c.leads = None;
                    }
                }
            }
            Step::Deliver(m) => {
                s.net.take(&m);
                self.deliver(&mut s, m);
            }
            Step::Act(Act::Campaign(c)) => {
                let c = usize::from(c);
                s.candidates[c].seen = s.ledger.highest;
                self.send_request(&mut s, c, |o, r| Msg::Campaign { o, r });
            }
            Step::Act(Act::Renew(c)) => {
                let c = usize::from(c);
                let term = s.candidates[c].leads.map_or(0, |(t, _)| t);
                self.send_request(&mut s, c, |o, r| Msg::Renew { o, r, term });
            }
            Step::Act(Act::Timeout(c)) => s.candidates[usize::from(c)].pending = None,
            Step::Act(Act::Resign(c)) => {
                let c = usize::from(c);
                let o = self.owner(c, s.candidates[c].life);
                if let Some((term, _)) = s.candidates[c].leads.take() {
                    s.net.send(Msg::Resign { o, term });
                }
            }
            Step::Act(Act::Crash(c)) => {
                let cand = &mut s.candidates[usize::from(c)];
                cand.life += 1;
                cand.pending = None;
                cand.leads = None;
                s.crashes_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one leader", |_, s: &State| leading(s) <= 1),
            Property::always("terms increase", |_, s: &State| !s.ledger.regressed),
            Property::sometimes("a second term", |_, s: &State| s.ledger.grants >= 2),
            Property::sometimes("a renewal", |_, s: &State| s.renewed),
        ]
    }
}
