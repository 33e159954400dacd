//! [`RedlockBackend`]: majority leases over independent Redis nodes.

use std::{
    collections::BTreeMap,
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use async_trait::async_trait;
use fencelock_core::{
    metrics as m, Acquire, AcquireRequest, Backend, BackendError, Capabilities, Error, ErrorStatus,
    FencingToken, Grant, LeaseId, LockInfo, LockKey, Owner, Result, WakeSubscription,
};
use fencelock_redis::{
    node::{field, map_error, parse_describe, ttl_ms, Call},
    RedisBackend, RedisOptions,
};
use futures_util::{
    future::{join_all, BoxFuture, Shared},
    stream::FuturesUnordered,
    FutureExt, StreamExt,
};
use redis::Value;
use tokio::time::Instant;

use crate::{
    fanout::{node_label, Fanout, Health, Request},
    options::{Bound, RedlockOptions},
    protocol::{self, validity, PROBES},
    scripts::Scripts,
};

mod admin;

pub(crate) const NAME: &str = "redlock";

/// Locks held by a majority of independent Redis nodes. Cheap to clone.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) options: RedlockOptions,
    nodes: Vec<Node>,
    scripts: Arc<Scripts>,
    pub(crate) health: Health,
    /// The latest node clock reading (µs) and when it arrived: tokens are
    /// guessed from it (docs/redlock.md, "Acquire").
    clock: Mutex<Option<(u64, Instant)>>,
    /// The highest token this backend proposed: no two attempts of one
    /// backend ever propose the same token.
    last: AtomicU64,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// One node, connected on first use: a node that is down when the backend
/// opens must not stop the others from being used, and is tried again on
/// a later call.
///
/// Opening a node takes several round trips (the connection, the scripts,
/// the pub/sub connection), more than one request's `node_timeout` allows
/// on a distant or loaded link. So it runs in a task of its own, bounded by
/// `connect_timeout`, and callers wait for it at most as long as they can
/// afford: a request that stops waiting leaves the attempt to carry on, and
/// a later request finds the node open instead of starting over.
struct Node {
    options: RedisOptions,
    /// Loaded as the node opens.
    scripts: Arc<Scripts>,
    state: Mutex<NodeState>,
}

/// A connection attempt, shared by every caller waiting for it. Errors
/// cannot be cloned, so each caller gets a [`Error::duplicate`].
type Attempt = Shared<BoxFuture<'static, std::result::Result<RedisBackend, Arc<Error>>>>;

enum NodeState {
    /// Not open, and no attempt under way: none yet, or the last failed.
    Closed,
    Opening(Attempt),
    Open(RedisBackend),
}

impl Node {
    fn new(options: RedisOptions, scripts: Arc<Scripts>) -> Self {
        Self {
            options,
            scripts,
            state: Mutex::new(NodeState::Closed),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's backend if it is open, without opening it.
    fn open(&self) -> Option<RedisBackend> {
        match &*self.state() {
            NodeState::Open(backend) => Some(backend.clone()),
            _ => None,
        }
    }

    /// The node's backend, opening it if need be; waits at most `wait` for
    /// the attempt under way (see the type's docs).
    async fn get(&self, wait: Duration) -> Result<RedisBackend> {
        let attempt = {
            let mut state = self.state();
            match &*state {
                NodeState::Open(backend) => return Ok(backend.clone()),
                NodeState::Opening(attempt) if !matches!(attempt.peek(), Some(Err(_))) => {
                    attempt.clone()
                }
                _ => {
                    let (options, scripts) = (self.options.clone(), Arc::clone(&self.scripts));
                    let task = tokio::spawn(async move {
                        let node = RedisBackend::connect_with(options).await?;
                        scripts.load(&node).await?;
                        Ok(node)
                    });
                    let attempt = async move {
                        match task.await {
                            Ok(opened) => opened.map_err(Arc::new),
                            Err(e) => Err(Arc::new(transient(format!("connect task failed: {e}")))),
                        }
                    }
                    .boxed()
                    .shared();
                    *state = NodeState::Opening(attempt.clone());
                    attempt
                }
            }
        };
        match tokio::time::timeout(wait, attempt).await {
            Ok(Ok(backend)) => {
                *self.state() = NodeState::Open(backend.clone());
                Ok(backend)
            }
            Ok(Err(e)) => Err(e.duplicate(NAME)),
            Err(_) => Err(BackendError::timeout(
                NAME,
                format!(
                    "connect: still opening after {wait:?} (it carries on for up to \
                     connect_timeout={:?})",
                    self.options.connect_timeout
                ),
            )
            .into()),
        }
    }
}

impl Inner {
    /// Runs `f` on node `i` (connecting it first if need be) within
    /// `bound`, and records in its health whether it answered.
    pub(crate) async fn call<T, F, Fut>(&self, i: usize, bound: Bound, f: F) -> Result<T>
    where
        F: FnOnce(RedisBackend) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let result = async {
            let node = self.nodes[i].get(bound.open).await?;
            f(node.bounded_by(bound.answer)).await
        }
        .await;
        metrics::histogram!(m::REDLOCK_NODE_SECONDS, "backend" => NAME, "node" => node_label(i))
            .record(started.elapsed().as_secs_f64());
        self.health.record(i, &result);
        result
    }

    /// [`call`](Self::call) as a request that may outlive its caller.
    pub(crate) fn request<T, F, Fut>(self: &Arc<Self>, i: usize, bound: Bound, f: F) -> Request<T>
    where
        T: Send + 'static,
        F: FnOnce(RedisBackend) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let inner = Arc::clone(self);
        async move { (i, inner.call(i, bound, f).await) }.boxed()
    }

    /// Release of `lease` (of `ttl`) on node `i`, its outcome ignored: the
    /// undo of a copy an acquisition left behind.
    pub(crate) fn undo(
        self: &Arc<Self>,
        i: usize,
        lease: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'static, ()> {
        let bound = self.options.lease_request(ttl);
        let request = self.request(
            i,
            bound,
            move |node| async move { node.release(&lease).await },
        );
        async move {
            let _ = request.await;
        }
        .boxed()
    }

    /// A node's clock, in µs, as just read.
    pub(crate) fn observe_clock(&self, now_us: u64) {
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if estimate(*clock, now).is_none_or(|us| us < now_us) {
            *clock = Some((now_us, now));
        }
    }

    /// A lower bound of the clock (µs) of the node read last, if any.
    pub(crate) fn clock_estimate(&self) -> Option<u64> {
        estimate(
            *self.clock.lock().unwrap_or_else(PoisonError::into_inner),
            Instant::now(),
        )
    }

    /// A token at least `at_least` and above every token this backend
    /// proposed before.
    pub(crate) fn propose(&self, at_least: u64) -> u64 {
        let mut proposed = at_least;
        let _ = self
            .last
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                proposed = at_least.max(last.saturating_add(1));
                Some(proposed)
            });
        proposed
    }

    /// The grant of `token` on node `i`; `replace`, the token this attempt
    /// sent the node before, if any (see `scripts::GRANT`).
    pub(crate) fn grant(
        self: &Arc<Self>,
        i: usize,
        args: &Arc<GrantArgs>,
        token: u64,
        replace: Option<u64>,
    ) -> Request<Answer> {
        let inner = Arc::clone(self);
        let args = Arc::clone(args);
        let bound = self.options.lease_request(args.ttl);
        self.request(i, bound, move |node| async move {
            let keys = node.keys();
            let key = &args.key;
            let row: Vec<Value> = Call::new(&inner.scripts.grant, 3)
                .key(keys.own("redlock"))
                .key(keys.lease(key))
                .key(keys.counter(key))
                .arg(args.owner.as_str())
                .arg(ttl_ms(args.ttl))
                .arg(args.kind.as_str())
                .arg(args.data.as_str())
                .arg(token)
                .arg(replace.map(|t| t.to_string()).unwrap_or_default())
                .invoke(&mut node.connection())
                .await
                .map_err(|e| map_error("grant script", e))?;
            Ok(match field::<i64>(&row, 0)? {
                1 => Answer::Granted {
                    now_ms: field(&row, 1)?,
                    now_us: number(&field::<String>(&row, 2)?)?,
                },
                0 => Answer::Held(parse_describe(key, &row)?),
                -1 => Answer::Unformed,
                -2 => Answer::Quarantined,
                _ => Answer::Stale {
                    top: number(&field::<String>(&row, 1)?)?,
                },
            })
        })
    }
}

/// What a clock reading `(µs, when)` says of the node's clock `now`: less
/// 1 % of the time since, so that it stays below the node's clock while
/// clock rates differ by less than that (docs/redlock.md).
fn estimate(clock: Option<(u64, Instant)>, now: Instant) -> Option<u64> {
    clock.map(|(us, at)| {
        let since =
            u64::try_from(now.saturating_duration_since(at).as_micros()).unwrap_or(u64::MAX);
        us.saturating_add(since - since / 100)
    })
}

/// Why each node that did not answer did not, as ` (node 2: …; …)`, or
/// nothing when every node answered.
fn unanswered<T>(per_node: &[Result<T>]) -> String {
    let why: Vec<String> = per_node
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("node {i}: {e}")))
        .collect();
    if why.is_empty() {
        String::new()
    } else {
        format!(" ({})", why.join("; "))
    }
}

/// What a node answered to the probe.
#[derive(Clone, Copy, Debug)]
struct Probe {
    formed: bool,
    top: u64,
    hwm: u64,
    /// How long ago the node was formed, on its clock (0 if unformed).
    age: Duration,
}

/// How [`RedlockBackend::heal`] forms unformed nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heal {
    /// A new set: no quarantine, floor at the clock.
    Fresh,
    /// A minority lost its data: quarantine, floor from a formed majority.
    Rejoin,
    /// A majority lost its data: quarantine, floor from every formed node
    /// and the clock.
    Reform,
}

/// What a node answered to the grant.
#[derive(Debug)]
pub(crate) enum Answer {
    Granted {
        now_ms: i64,
        now_us: u64,
    },
    Held(Option<LockInfo>),
    Unformed,
    Quarantined,
    /// The token is not above the key's counter or the node's floor; what
    /// the probe would answer (`top`).
    Stale {
        top: u64,
    },
}

/// What a grant asks of every node, owned so that a request can outlive
/// the call that sent it (docs/redlock.md, "Late grants").
pub(crate) struct GrantArgs {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) kind: String,
    pub(crate) data: String,
}

pub(crate) fn transient(message: impl Into<String>) -> Error {
    BackendError::message(NAME, ErrorStatus::Transient, message).into()
}

fn number(s: &str) -> Result<u64> {
    s.parse()
        .map_err(|_| fencelock_redis::node::bad_reply(format!("{s:?} is not a token")))
}

impl RedlockBackend {
    /// A backend over `options`' nodes. Nothing is contacted yet: each node
    /// connects on first use.
    pub fn new(options: RedlockOptions) -> Self {
        let scripts = Arc::new(Scripts::new());
        let nodes = options
            .nodes
            .iter()
            .map(|o| Node::new(o.clone(), Arc::clone(&scripts)))
            .collect();
        let health = Health::new(options.nodes.len(), options.quorum(), options.node_timeout);
        Self {
            inner: Arc::new(Inner {
                options,
                nodes,
                scripts,
                health,
                clock: Mutex::new(None),
                last: AtomicU64::new(0),
            }),
        }
    }

    /// A backend for `url` (see [`RedlockOptions::from_url`]). Succeeds
    /// once a majority of nodes is open, within `connect_timeout`; the
    /// other nodes carry on opening in the background.
    pub async fn connect(url: &str) -> Result<Self> {
        let backend = Self::new(RedlockOptions::from_url(url)?);
        backend.open_majority().await?;
        Ok(backend)
    }

    async fn open_majority(&self) -> Result<()> {
        let inner = &self.inner;
        let wait = inner.options.connect_timeout;
        let mut opening: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move { (i, node.get(wait).await) })
            .collect();
        // Without a majority, every node has ended its attempt by the time
        // the loop ends.
        let mut ended = Vec::with_capacity(inner.nodes.len());
        let mut open = 0;
        while let Some((i, opened)) = opening.next().await {
            inner.health.record(i, &opened);
            open += usize::from(opened.is_ok());
            if open >= self.quorum() {
                return Ok(());
            }
            ended.push((i, opened.map(drop)));
        }
        ended.sort_by_key(|(i, _)| *i);
        let per_node: Vec<Result<()>> = ended.into_iter().map(|(_, r)| r).collect();
        self.need_answers(&per_node, "connect")
    }

    /// The options.
    pub fn options(&self) -> &RedlockOptions {
        &self.inner.options
    }

    pub(crate) fn quorum(&self) -> usize {
        self.inner.options.quorum()
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// [`need_quorum`](Self::need_quorum) over one result per node; the
    /// error says why each node that failed did, so that "0 of 3 nodes
    /// answered" tells refused from timed out or skipped.
    fn need_answers<T>(&self, per_node: &[Result<T>], what: &str) -> Result<()> {
        let answered = per_node.iter().filter(|r| r.is_ok()).count();
        if answered >= self.quorum() {
            return Ok(());
        }
        Err(self.short_of(answered, what, &unanswered(per_node)))
    }

    fn need_quorum(&self, answered: usize, what: &str) -> Result<()> {
        if answered >= self.quorum() {
            Ok(())
        } else {
            Err(self.short_of(answered, what, ""))
        }
    }

    fn short_of(&self, answered: usize, what: &str, why: &str) -> Error {
        transient(format!(
            "{what}: {answered} of {} nodes answered, {} needed{why}",
            self.inner.nodes.len(),
            self.quorum()
        ))
    }

    /// Runs `f` on every node worth asking (see [`Health::targets`]) at
    /// once, each within `bound`, and waits for every answer; one result
    /// per node, in URL order, a skipped node's a transient error.
    async fn on_all<T, F, Fut>(&self, bound: Bound, f: F) -> Vec<Result<T>>
    where
        F: Fn(RedisBackend) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.on_all_until(bound, f, |_| false).await
    }

    /// [`on_all`](Self::on_all), but done as soon as the answers so far
    /// are `enough`: the nodes still to answer then count as skipped, as if
    /// their bound had run out.
    async fn on_all_until<T, F, Fut>(
        &self,
        bound: Bound,
        f: F,
        enough: impl Fn(&[Result<T>]) -> bool,
    ) -> Vec<Result<T>>
    where
        F: Fn(RedisBackend) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let skipped = |i: usize, why: &str| Err(transient(format!("node {i} is skipped: {why}")));
        let mut out: Vec<Result<T>> = (0..self.inner.nodes.len())
            .map(|i| skipped(i, "it did not answer a moment ago"))
            .collect();
        let mut pending: Vec<usize> = self
            .inner
            .health
            .targets()
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        let mut asked: FuturesUnordered<_> = pending
            .iter()
            .map(|&i| {
                let f = &f;
                async move { (i, self.inner.call(i, bound, f).await) }
            })
            .collect();
        while let Some((i, answer)) = asked.next().await {
            out[i] = answer;
            pending.retain(|&p| p != i);
            if !pending.is_empty() && enough(&out) {
                for i in pending {
                    out[i] = skipped(i, "the others' answers were enough");
                }
                break;
            }
        }
        out
    }

    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let max = self.inner.options.max_ttl;
        if ttl > max {
            return Err(Error::InvalidTtl(format!(
                "{:?} is above this redlock's max_ttl {max:?} (a restarted node's quarantine)",
                ttl
            )));
        }
        Ok(())
    }

    /// Probes every node, done as soon as a majority of formed nodes has
    /// answered: what `fresh_top` takes from them is the same whether the
    /// others answer later or not at all, and a node that accepts
    /// connections and never answers (stopped) used to hold every new
    /// client's first acquisition for the whole bound of its opening
    /// connection (the TTL, at most `connect_timeout`). Without such a
    /// majority it waits for every node: forming a new set, or a majority
    /// that lost its data, needs them all.
    async fn probe(&self, key: &LockKey, bound: Bound) -> Vec<Result<Probe>> {
        let script = &self.inner.scripts.probe;
        let inner = &self.inner;
        let quorum = self.quorum();
        let formed_majority = |probes: &[Result<Probe>]| {
            probes.iter().flatten().filter(|p| p.formed).count() >= quorum
        };
        self.on_all_until(
            bound,
            |node| async move {
                let keys = node.keys();
                let row: Vec<Value> = Call::new(script, 2)
                    .key(keys.own("redlock"))
                    .key(keys.counter(key))
                    .invoke(&mut node.connection())
                    .await
                    .map_err(|e| map_error("probe script", e))?;
                inner.observe_clock(number(&field::<String>(&row, 5)?)?);
                Ok(Probe {
                    formed: field::<i64>(&row, 0)? == 1,
                    top: number(&field::<String>(&row, 2)?)?,
                    hwm: number(&field::<String>(&row, 3)?)?,
                    // A negative age (a clock stepped back) counts as new.
                    age: Duration::from_millis(u64::try_from(field::<i64>(&row, 4)?).unwrap_or(0)),
                })
            },
            formed_majority,
        )
        .await
    }

    /// Forms the nodes that answered unformed (docs/redlock.md, "Nodes
    /// that lose their data"):
    ///
    /// - every node answered and none is formed (a new set): all at once,
    ///   voting at once, floored at their clocks;
    /// - a majority of formed nodes answered (even nodes that have never
    ///   granted anything): each joins, quarantined for `max_ttl` + 1 %,
    ///   floored above the highest token of that majority;
    /// - every node answered and a majority is unformed (a majority lost
    ///   its data, which no formed majority can ever vouch for again):
    ///   each joins, quarantined the same way, floored above the highest
    ///   token of every formed node and above what its own clock in µs
    ///   will read when the quarantine ends.
    ///
    /// Returns whether nodes were formed that vote now.
    async fn heal(&self, probes: &[Result<Probe>], bound: Bound) -> Result<bool> {
        let formed: Vec<&Probe> = probes.iter().flatten().filter(|p| p.formed).collect();
        let unformed = probes.iter().flatten().filter(|p| !p.formed).count();
        if unformed == 0 {
            return Ok(false);
        }
        let everyone = probes.iter().all(Result::is_ok);
        let max_ttl = self.inner.options.max_ttl;
        let quarantine = protocol::quarantine(max_ttl);
        let highest = formed.iter().map(|p| p.hwm).max().unwrap_or(0);
        let (quarantine, floor, how) = if unformed == self.inner.nodes.len() {
            (Duration::ZERO, 0, Heal::Fresh)
        } else if formed.len() >= self.quorum() {
            // Even when those nodes have never granted anything: a grant
            // the empty node made before it lost its data may still reach
            // them (the model's planted bug `fresh-join`,
            // docs/safety.md), so the node waits out that lease.
            (quarantine, highest, Heal::Rejoin)
        } else if everyone {
            // Fewer than a majority is formed and every node answered: a
            // majority answered empty. Unless another client is forming a
            // new set right now (its formed nodes have granted nothing and
            // were formed moments ago), that majority lost its data, and
            // with it the only copy of some leases and tokens: no formed
            // majority will ever answer again, so waiting for one (as a
            // rejoin does) would wait forever.
            let forming = self.inner.options.node_timeout * 4;
            if formed.iter().all(|p| p.hwm == 0 && p.age < forming) {
                return Ok(false);
            }
            (quarantine, highest, Heal::Reform)
        } else {
            // Some node did not answer: it may be formed and hold tokens
            // the others lack. Wait for it.
            return Ok(false);
        };
        let script = &self.inner.scripts.join;
        let quarantine_ms = u64::try_from(quarantine.as_millis()).unwrap_or(u64::MAX);
        let mode = match how {
            Heal::Fresh => "fresh",
            Heal::Rejoin => "join",
            Heal::Reform => "reform",
        };
        let joined = join_all(
            self.inner
                .nodes
                .iter()
                .zip(probes)
                .enumerate()
                .filter(|(_, (_, p))| matches!(p, Ok(p) if !p.formed))
                .map(|(i, _)| {
                    self.inner.call(i, bound, |node| async move {
                        let keys = node.keys();
                        Call::new(script, 1)
                            .key(keys.own("redlock"))
                            .arg(quarantine_ms)
                            .arg(floor)
                            .arg(mode)
                            .invoke::<i64>(&mut node.connection())
                            .await
                            .map_err(|e| map_error("join script", e))
                    })
                }),
        )
        .await;
        let count = joined.iter().filter(|r| matches!(r, Ok(1))).count();
        if count > 0 {
            match how {
                Heal::Fresh => tracing::info!(nodes = count, "redlock: formed a new set of nodes"),
                Heal::Rejoin => tracing::warn!(
                    nodes = count,
                    floor,
                    "redlock: nodes without data joined; they vote after {:?}",
                    quarantine
                ),
                Heal::Reform => tracing::warn!(
                    nodes = count,
                    floor,
                    "redlock: a majority of nodes lost their data and re-formed; they vote after \
                     {:?}, with tokens above their clocks by then",
                    quarantine
                ),
            }
        }
        Ok(how == Heal::Fresh)
    }

    /// The slow path of an acquisition (docs/redlock.md, "Acquire"): a
    /// probe of every node worth asking, forming unformed nodes where the
    /// rules allow; the highest `top` of a majority of formed nodes, above
    /// every token a majority has seen for `key`. Each node's request is
    /// bounded as a grant of a lease of `ttl` is.
    pub(crate) async fn fresh_top(&self, key: &LockKey, ttl: Duration) -> Result<u64> {
        let bound = self.inner.options.lease_request(ttl);
        let mut outcome = Err(transient("no probe ran"));
        for _ in 0..PROBES {
            let probes = self.probe(key, bound).await;
            if self.heal(&probes, bound).await? {
                continue;
            }
            let formed: Vec<&Probe> = probes.iter().flatten().filter(|p| p.formed).collect();
            if formed.len() < self.quorum() && formed.len() < probes.iter().flatten().count() {
                // Another client may be forming or re-forming the nodes
                // right now; else too few are formed (docs/redlock.md).
                outcome = Err(transient(format!(
                    "acquire: {} of {} nodes are formed ({} needed); a new set forms when \
                     every node answers; a node that lost its data rejoins when a majority of \
                     formed nodes answers, or, when a majority lost it, when every node \
                     answers; it votes max_ttl + 1 % later{}",
                    formed.len(),
                    self.inner.nodes.len(),
                    self.quorum(),
                    unanswered(&probes)
                )));
                continue;
            }
            self.need_quorum(formed.len(), "acquire (formed nodes)")?;
            // Every earlier grant wrote its token to a majority, and two
            // majorities share a node.
            return Ok(formed.iter().map(|p| p.top).max().unwrap_or(0));
        }
        outcome
    }

    /// The leases a majority of nodes agree on (same key, owner and token),
    /// each as the node that ends it first reports it. "First" is the
    /// earliest `expires_at`, not the smallest `expires_in`: that one
    /// depends on when each node answered, so two reads of an unchanged
    /// lease could pick different nodes' views. A lease on fewer nodes is
    /// being granted, released or has failed: it is not shown.
    fn agreed(&self, per_node: Vec<Result<Vec<LockInfo>>>, what: &str) -> Result<Vec<LockInfo>> {
        self.need_answers(&per_node, what)?;
        let mut seen: BTreeMap<(LockKey, Owner, FencingToken), (usize, LockInfo)> = BTreeMap::new();
        for info in per_node.into_iter().flatten().flatten() {
            let id = (info.key.clone(), info.owner.clone(), info.token);
            match seen.get_mut(&id) {
                Some((n, first)) => {
                    *n += 1;
                    if (info.expires_at, info.expires_in) < (first.expires_at, first.expires_in) {
                        *first = info;
                    }
                }
                None => {
                    seen.insert(id, (1, info));
                }
            }
        }
        Ok(seen
            .into_values()
            .filter(|(n, _)| *n >= self.quorum())
            .map(|(_, info)| info)
            .collect())
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_persistent(true)
            .with_min_token(true)
            .with_wakeups(true)
    }

    /// Wake-ups from every open node at once: each node a release reaches
    /// publishes it, and the first to tell wakes the waiter, who then needs
    /// one round trip to a majority, not a poll's back-off on top. Answers
    /// once one node has subscribed, so that a waiter beside one node does
    /// not wait for the farthest; the others join as their subscriptions
    /// are acknowledged. `None` when no node could subscribe (the waiter
    /// backs off as before).
    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        let bound = self.inner.options.node_timeout;
        let mut subscribing: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .filter_map(Node::open)
            .map(|node| {
                let key = key.clone();
                async move {
                    match tokio::time::timeout(bound, node.subscribe(&key)).await {
                        Ok(Ok(subscription)) => subscription,
                        _ => None,
                    }
                }
            })
            .collect();
        let mut first = None;
        while let Some(answer) = subscribing.next().await {
            if answer.is_some() {
                first = answer;
                break;
            }
        }
        let Some(first) = first else {
            return Ok(None);
        };
        let wakes = futures_util::stream::once(async move { Some(first) })
            .chain(subscribing)
            .filter_map(|s| async move { s })
            .map(|subscription| {
                Box::pin(futures_util::stream::unfold(
                    subscription,
                    |mut s| async move { s.woken().await.then_some(((), s)) },
                ))
            })
            .flatten_unordered(None);
        Ok(Some(WakeSubscription::from_stream(wakes)))
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        request.exclusive_only(self.name())?;
        self.acquire(request).await
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        lease.exclusive_only(self.name())?;
        self.check_ttl(ttl)?;
        let n = self.inner.nodes.len();
        let sent = Instant::now();
        let shared = Arc::new(lease.clone());
        let mut fanout = Fanout::new(n);
        for (i, role) in self.inner.health.targets() {
            let lease = Arc::clone(&shared);
            fanout.push(
                i,
                role,
                self.inner.request(
                    i,
                    self.inner.options.lease_request(ttl),
                    move |node| async move { node.renew(&lease, ttl).await },
                ),
            );
        }
        // Decided as soon as a majority extended the lease, or so many
        // said "not held" that no majority can: a straggler's extension is
        // of this same lease.
        let mut ends = Vec::new();
        let mut not_held = 0;
        while let Some((_, answer)) = fanout.next().await {
            match answer {
                Ok(grant) => ends.push(grant.expires_at),
                Err(Error::NotHeld { .. }) => not_held += 1,
                Err(_) => {}
            }
            if ends.len() >= self.quorum() || n - not_held < self.quorum() {
                break;
            }
        }
        fanout.detach(Vec::new(), |_, _| None);
        let left = validity(ttl, sent.elapsed());
        match (ends.len() >= self.quorum(), left) {
            (true, Some(_)) => Ok(Grant::new(
                lease.token,
                ttl,
                ends.into_iter().min().unwrap_or_default(),
            )),
            _ if n - not_held < self.quorum() => Err(Error::not_held(lease)),
            _ => Err(transient(format!(
                "renew: {} of {n} nodes extended the lease ({} needed{})",
                ends.len(),
                self.quorum(),
                if left.is_none() { ", too late" } else { "" }
            ))),
        }
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        lease.exclusive_only(self.name())?;
        let shared = Arc::new(lease.clone());
        let mut fanout = Fanout::new(self.inner.nodes.len());
        for (i, role) in self.inner.health.targets() {
            let lease = Arc::clone(&shared);
            fanout.push(
                i,
                role,
                self.inner.request(
                    i,
                    self.inner.options.release_request(),
                    move |node| async move { node.release(&lease).await },
                ),
            );
        }
        // Decided once a majority answered: at most a minority can then
        // still hold a copy (its release under way), and a minority
        // excludes nobody.
        let (mut removed, mut not_held) = (0, 0);
        let mut failure = None;
        while let Some((_, answer)) = fanout.next().await {
            match answer {
                Ok(()) => removed += 1,
                Err(Error::NotHeld { .. }) => not_held += 1,
                Err(e) => failure = failure.or(Some(e)),
            }
            if (removed > 0 && removed + not_held >= self.quorum()) || not_held >= self.quorum() {
                break;
            }
        }
        fanout.detach(Vec::new(), |_, _| None);
        if removed > 0 {
            return Ok(());
        }
        if not_held >= self.quorum() {
            return Err(Error::not_held(lease));
        }
        Err(failure.unwrap_or_else(|| Error::not_held(lease)))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let answers = self
            .on_all(self.inner.options.plain_request(), |node| async move {
                Ok(node.inspect(key).await?.into_iter().collect())
            })
            .await;
        Ok(self.agreed(answers, "inspect")?.into_iter().next())
    }

    fencelock_core::offers!(admin);
}
