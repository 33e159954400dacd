//! `try_acquire`: one grant round to every node at once, with a token the
//! client guesses; more rounds only when the guess was low or racers split
//! the vote (docs/redlock.md, "Acquire").

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, FencingToken, Grant, LeaseId, LockInfo, Owner, Result,
};
use fencelock_redis::node::{label_and_data, ms_to_time, ttl_ms};
use futures_util::{
    future::{join_all, BoxFuture},
    FutureExt,
};
use tokio::time::Instant;

use crate::{
    backend::{transient, Answer, GrantArgs, RedlockBackend},
    fanout::Fanout,
    protocol::{validity, ROUNDS},
};

/// The first wait before the holder of the arbiter asks again the nodes
/// other racers hold (they are removing their copies); doubled each round.
const BACKOFF: Duration = Duration::from_millis(1);

/// What this attempt may have left on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Copy {
    None,
    /// Granted with this token, the node's clock then in ms.
    Held {
        token: u64,
        now_ms: i64,
    },
    /// A request with this token was sent and its outcome is not known.
    Unknown(u64),
}

impl Copy {
    /// The token of a copy this attempt may hold there.
    fn token(self) -> Option<u64> {
        match self {
            Copy::None => None,
            Copy::Held { token, .. } | Copy::Unknown(token) => Some(token),
        }
    }
}

/// How a node voted in the last round.
#[derive(Debug)]
enum Vote {
    /// Holds a copy of this attempt's.
    Mine,
    /// Held by someone else.
    Other(Option<LockInfo>),
    /// Free, but the token was not above its counter or floor.
    Stale(u64),
}

/// How the attempt ended.
enum Outcome {
    Won,
    Lost(Result<Acquire>),
}

impl RedlockBackend {
    pub(crate) async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.check_ttl(request.ttl)?;
        let (kind, data) = label_and_data(request)?;
        let floor = request.floor()?;
        let inner = self.inner();
        let n = inner.options.nodes.len();
        let quorum = self.quorum();
        let args = Arc::new(GrantArgs {
            key: request.key.clone(),
            owner: request.owner.clone(),
            ttl: request.ttl,
            kind,
            data,
        });
        // A lower bound of a node's clock is above the tokens of every grant
        // but the last few µs' (tokens follow the clocks); the first time,
        // or when that guess was low, the nodes say what is.
        let seen = match inner.clock_estimate() {
            Some(us) => us,
            None => self.fresh_top(&request.key, request.ttl).await?,
        };
        let mut token = request
            .issued(inner.propose(seen.max(floor).saturating_add(1)))?
            .get();
        let mut copies = vec![Copy::None; n];
        let mut asked = vec![false; n];
        let mut fanout: Fanout<Answer> = Fanout::new(n);
        let started = Instant::now();
        let mut healed = false;
        let mut unformed = false;
        let mut backoff = BACKOFF;
        let mut counts = Counts::default();
        let mut outcome = None;
        let mut votes: Vec<Option<Vote>> = Vec::new();
        for _ in 0..ROUNDS {
            for (i, role) in inner.health.targets() {
                if fanout.is_pending(i)
                    || matches!(copies[i], Copy::Held { token: t, .. } if t == token)
                {
                    continue;
                }
                let replace = copies[i].token();
                copies[i] = Copy::Unknown(token);
                asked[i] = true;
                fanout.push(i, role, inner.grant(i, &args, token, replace));
            }
            votes = copies
                .iter()
                .map(|c| match c {
                    Copy::Held { token: t, .. } if *t == token => Some(Vote::Mine),
                    _ => None,
                })
                .collect();
            counts = Counts::default();
            while let Some((i, answer)) = fanout.next().await {
                let sent = copies[i].token().unwrap_or(token);
                match answer {
                    Ok(Answer::Granted { now_ms, now_us }) => {
                        inner.observe_clock(now_us);
                        copies[i] = Copy::Held {
                            token: sent,
                            now_ms,
                        };
                        votes[i] = Some(Vote::Mine);
                    }
                    Ok(other) => {
                        copies[i] = Copy::None;
                        match other {
                            Answer::Held(info) => votes[i] = Some(Vote::Other(info)),
                            Answer::Stale { top } => votes[i] = Some(Vote::Stale(top)),
                            Answer::Unformed => {
                                counts.unformed += 1;
                                unformed = true;
                            }
                            _ => counts.quarantined += 1,
                        }
                    }
                    Err(_) => counts.failed += 1,
                }
                if granted(&copies, token) >= quorum {
                    outcome = Some(Outcome::Won);
                    break;
                }
                if let Some(holder) = majority_holder(&votes, quorum) {
                    outcome = Some(Outcome::Lost(Ok(Acquire::Held(Some(holder)))));
                    break;
                }
            }
            if outcome.is_some() || validity(request.ttl, started.elapsed()).is_none() {
                break;
            }
            // Every node asked (and not skipped) has answered.
            if counts.unformed > 0 && !healed {
                // A node lost its data: the probe forms it where the rules
                // allow, and tells the tokens the formed nodes have seen.
                healed = true;
                if let Ok(top) = self.fresh_top(&request.key, request.ttl).await {
                    token = request
                        .issued(inner.propose(top.max(floor).max(token).saturating_add(1)))?
                        .get();
                    continue;
                }
            }
            // The arbiter: the first node, in URL order, that voted. Racers
            // that did not get it yield to the one that did.
            match votes.iter().flatten().next() {
                Some(Vote::Other(holder)) => {
                    outcome = Some(Outcome::Lost(Ok(Acquire::Held(holder.clone()))));
                    break;
                }
                None => break,
                Some(_) => {}
            }
            if votes.iter().flatten().count() < quorum {
                break;
            }
            let stale = votes
                .iter()
                .flatten()
                .filter_map(|v| match v {
                    Vote::Stale(top) => Some(*top),
                    _ => None,
                })
                .max();
            if let Some(top) = stale {
                // Free where refused: ask again above what those nodes saw;
                // the copies held already take the new token (`replace`).
                token = request
                    .issued(inner.propose(top.max(floor).max(token).saturating_add(1)))?
                    .get();
            } else {
                // The arbiter is ours; racers that hold other nodes without
                // a majority are taking their copies back.
                if started.elapsed() + backoff >= inner.options.node_timeout {
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
        }
        let won = matches!(outcome, Some(Outcome::Won))
            && validity(request.ttl, started.elapsed()).is_some();
        let kept = won.then_some(token);
        self.clean_up(&request.owner, &args, &copies, fanout, kept)
            .await;
        if unformed && !healed {
            // Decided without the node that lost its data: form it now, or
            // it would never rejoin while the key's fate needs no probe.
            let _ = self.fresh_top(&request.key, request.ttl).await;
        }
        if won {
            let start = copies
                .iter()
                .filter_map(|c| match c {
                    Copy::Held { token: t, now_ms } if *t == token => Some(*now_ms),
                    _ => None,
                })
                .min()
                .unwrap_or(0);
            let ends = start.saturating_add(i64::try_from(ttl_ms(request.ttl)).unwrap_or(0));
            // Every node keeps the lease for the full TTL from its grant,
            // which came after `started`: the guard's deadline (I5) ends
            // before the first node's lease does.
            return Ok(Acquire::Granted(Grant::new(
                FencingToken(token),
                request.ttl,
                ms_to_time(ends),
            )));
        }
        let holder = votes.iter().flatten().find_map(|v| match v {
            Vote::Other(holder) => Some(holder.clone()),
            _ => None,
        });
        let raced = votes.iter().flatten().any(|v| matches!(v, Vote::Stale(_)));
        match outcome {
            Some(Outcome::Lost(answer)) => answer,
            // Still held by a holder without a majority (a node forgot its
            // copy, or another attempt's undo is under way), or another
            // acquirer kept drawing higher tokens: it may hold the key.
            _ if holder.is_some() => Ok(Acquire::Held(holder.flatten())),
            _ if raced => Ok(Acquire::Held(None)),
            _ => Err(transient(format!(
                "acquire: {} of {n} nodes granted ({quorum} needed{}), {} not voting, {} \
                 unreachable, {} skipped",
                granted(&copies, token),
                if validity(request.ttl, started.elapsed()).is_none() {
                    ", too late"
                } else {
                    ""
                },
                counts.quarantined + counts.unformed,
                counts.failed,
                asked.iter().filter(|a| !**a).count(),
            ))),
        }
    }

    /// Takes back every copy this attempt may have left that is not the
    /// lease it returns (`kept`): copies with an older token, all of them
    /// when it failed, and the late answers of the requests still under
    /// way. A failed attempt waits for the undo of the copies it knows of
    /// (nodes that answered), so that what it leaves behind is only what
    /// it could not know; the rest (requests under way, and those that
    /// failed without an answer) is undone in the background.
    /// Requests of one attempt to one node never overlap and a node's
    /// connection is ordered, so a node ends as its last request left it,
    /// and each undo follows that request.
    async fn clean_up(
        &self,
        owner: &Owner,
        args: &Arc<GrantArgs>,
        copies: &[Copy],
        fanout: Fanout<Answer>,
        kept: Option<u64>,
    ) {
        let inner = Arc::clone(self.inner());
        let lease = |t: u64| LeaseId::new(args.key.clone(), owner.clone(), FencingToken(t));
        // Copies of requests that ended: those a node answered, and those
        // of requests that failed, which the node may or may not hold.
        let (mut now, mut unsure): (Vec<BoxFuture<'static, ()>>, Vec<_>) = (vec![], vec![]);
        for (i, c) in copies.iter().enumerate() {
            if fanout.is_pending(i) {
                continue;
            }
            if let Some(t) = c.token().filter(|&t| Some(t) != kept) {
                let undo = inner.undo(i, lease(t), args.ttl);
                match c {
                    Copy::Held { .. } => now.push(undo),
                    _ => unsure.push(undo),
                }
            }
        }
        let pending: Vec<Option<LeaseId>> = copies
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.token()
                    .filter(|&t| fanout.is_pending(i) && Some(t) != kept)
                    .map(lease)
            })
            .collect();
        let late = {
            let inner = Arc::clone(&inner);
            let backend = self.clone();
            let (key, ttl) = (args.key.clone(), args.ttl);
            move |i: usize, answer: Result<Answer>| {
                if matches!(answer, Ok(Answer::Unformed)) {
                    // A node that lost its data answered after the attempt
                    // was decided: form it, or it would never rejoin while
                    // the living nodes decide every attempt without it.
                    let (backend, key) = (backend.clone(), key.clone());
                    return Some(
                        async move {
                            let _ = backend.fresh_top(&key, ttl).await;
                        }
                        .boxed(),
                    );
                }
                let lease = pending.get(i).cloned().flatten()?;
                // Granted, or no answer: the copy may be there.
                matches!(answer, Ok(Answer::Granted { .. }) | Err(_))
                    .then(|| inner.undo(i, lease, ttl))
            }
        };
        if kept.is_some() {
            now.append(&mut unsure);
            fanout.detach(now, late);
        } else {
            // A node that did not answer may not answer its undo either:
            // waiting for it would make a retry wait out its bound.
            fanout.detach(unsure, late);
            join_all(now).await;
        }
    }
}

/// Why an attempt failed, for its error.
#[derive(Default)]
struct Counts {
    unformed: usize,
    quarantined: usize,
    failed: usize,
}

/// How many nodes hold this attempt's copy with `token`.
fn granted(copies: &[Copy], token: u64) -> usize {
    copies
        .iter()
        .filter(|c| matches!(c, Copy::Held { token: t, .. } if *t == token))
        .count()
}

/// A holder other than this attempt that a majority of nodes reported:
/// the key is held.
fn majority_holder(votes: &[Option<Vote>], quorum: usize) -> Option<LockInfo> {
    let mut seen: BTreeMap<(&str, FencingToken), (usize, &LockInfo)> = BTreeMap::new();
    for info in votes.iter().flatten().filter_map(|v| match v {
        Vote::Other(Some(info)) => Some(info),
        _ => None,
    }) {
        let entry = seen
            .entry((info.owner.as_str(), info.token))
            .or_insert((0, info));
        entry.0 += 1;
        if entry.0 >= quorum {
            return Some(info.clone());
        }
    }
    None
}
