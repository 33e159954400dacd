//! Requests to every node at once, answered as they come, and which nodes
//! are worth asking: a node whose request failed (timeout, refused, reset)
//! is skipped for a while, then tried again by an operation that does not
//! wait for it (docs/redlock.md, "Nodes that do not answer").

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use fencelock_core::{metrics as m, Error, Result};
use futures_util::{future::BoxFuture, stream::FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::backend::NAME;

/// How long a node is skipped after its first failed request; doubled
/// after each further one, up to [`SKIP_MAX`] (or `node_timeout`, if
/// longer). One trial at a time is under way, however long its bound. Short
/// at first, so that a node restarted at once rejoins at once; trials cost
/// the operations nothing, so even the longest skip is about load, not
/// latency.
const SKIP: Duration = Duration::from_millis(50);

/// The longest skip.
const SKIP_MAX: Duration = Duration::from_millis(250);

/// The `node` label of node `i` in the metrics: static for the sets
/// anyone runs, so that labelling each request allocates nothing.
pub(crate) fn node_label(i: usize) -> metrics::SharedString {
    const LABELS: [&str; 9] = ["0", "1", "2", "3", "4", "5", "6", "7", "8"];
    match LABELS.get(i) {
        Some(label) => metrics::SharedString::const_str(label),
        None => i.to_string().into(),
    }
}

/// What the client knows of one node's health.
#[derive(Debug, Default)]
struct State {
    /// Skipped until then, after a failed request.
    down_until: Option<Instant>,
    /// Failed requests in a row.
    failures: u32,
    /// A trial request to the down node is under way.
    trial: bool,
}

/// The health of every node, in URL order.
#[derive(Debug)]
pub(crate) struct Health {
    nodes: Vec<Mutex<State>>,
    skip_max: Duration,
    quorum: usize,
}

/// How an operation asks a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The operation waits for the answer (up to the request's bound).
    Wait,
    /// A down node tried again: its answer counts if it comes before the
    /// operation has decided, and the operation does not wait for it.
    Trial,
}

/// Whether a result shows that the node answered. "Not held" is an answer;
/// a permanent error (a script bug, a wrong password) is one too, which
/// skipping the node would not cure.
fn answered<T>(result: &Result<T>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => matches!(e, Error::NotHeld { .. }) || !e.is_transient(),
    }
}

impl Health {
    pub(crate) fn new(nodes: usize, quorum: usize, node_timeout: Duration) -> Self {
        Self {
            nodes: (0..nodes).map(|_| Mutex::new(State::default())).collect(),
            skip_max: SKIP_MAX.max(node_timeout),
            quorum,
        }
    }

    fn state(&self, i: usize) -> std::sync::MutexGuard<'_, State> {
        self.nodes[i].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The nodes an operation asks now, and how. While a majority is up,
    /// a down node is skipped until its time has come, then asked once as
    /// a trial; with fewer up, every node is asked and waited for, since
    /// nothing can be decided without them.
    pub(crate) fn targets(&self) -> Vec<(usize, Role)> {
        let up = (0..self.nodes.len())
            .filter(|&i| self.state(i).down_until.is_none())
            .count();
        if up < self.quorum {
            return (0..self.nodes.len()).map(|i| (i, Role::Wait)).collect();
        }
        let now = Instant::now();
        (0..self.nodes.len())
            .filter_map(|i| {
                let mut state = self.state(i);
                match state.down_until {
                    None => Some((i, Role::Wait)),
                    Some(until) if now >= until && !state.trial => {
                        state.trial = true;
                        Some((i, Role::Trial))
                    }
                    Some(_) => None,
                }
            })
            .collect()
    }

    /// Records how a request to node `i` ended.
    pub(crate) fn record<T>(&self, i: usize, result: &Result<T>) {
        let mut state = self.state(i);
        state.trial = false;
        if answered(result) {
            state.failures = 0;
            if state.down_until.take().is_some() {
                tracing::info!(node = i, "redlock: node answers again");
            }
        } else {
            if state.down_until.is_none() {
                tracing::warn!(
                    node = i,
                    "redlock: node did not answer; skipped, and tried again now and then"
                );
                metrics::counter!(m::REDLOCK_NODE_SKIPS, "backend" => NAME, "node" => node_label(i))
                    .increment(1);
            }
            let skip = SKIP
                .saturating_mul(1 << state.failures.min(16))
                .min(self.skip_max);
            state.failures = state.failures.saturating_add(1);
            state.down_until = Some(Instant::now() + skip);
        }
    }
}

/// One node's request: its index and its result.
pub(crate) type Request<T> = BoxFuture<'static, (usize, Result<T>)>;

/// Requests under way to several nodes, answered in the order they come.
pub(crate) struct Fanout<T> {
    pending: FuturesUnordered<Request<T>>,
    /// Per node: a request is under way, and whether it is a trial.
    under_way: Vec<Option<Role>>,
}

impl<T: Send + 'static> Fanout<T> {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            pending: FuturesUnordered::new(),
            under_way: vec![None; nodes],
        }
    }

    pub(crate) fn push(&mut self, i: usize, role: Role, request: Request<T>) {
        self.under_way[i] = Some(role);
        self.pending.push(request);
    }

    /// Whether a request to node `i` is under way.
    pub(crate) fn is_pending(&self, i: usize) -> bool {
        self.under_way[i].is_some()
    }

    /// The next answer, while a request the caller waits for is under way
    /// (a trial's answer is returned if it comes first); `None` once only
    /// trials are left.
    pub(crate) async fn next(&mut self) -> Option<(usize, Result<T>)> {
        if !self.under_way.contains(&Some(Role::Wait)) {
            return None;
        }
        let (i, result) = self.pending.next().await?;
        self.under_way[i] = None;
        Some((i, result))
    }

    /// Leaves the requests still under way to finish in the background
    /// (each records its node's health itself), handing each late answer
    /// to `late`, which may return a follow-up request (a cleanup) to run
    /// there too. Nothing is spawned when nothing is left.
    pub(crate) fn detach<F>(self, cleanups: Vec<BoxFuture<'static, ()>>, mut late: F)
    where
        F: FnMut(usize, Result<T>) -> Option<BoxFuture<'static, ()>> + Send + 'static,
    {
        let mut pending = self.pending;
        if pending.is_empty() && cleanups.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let mut follow_ups: FuturesUnordered<BoxFuture<'static, ()>> =
                cleanups.into_iter().collect();
            loop {
                tokio::select! {
                    Some((i, result)) = pending.next() => {
                        if let Some(f) = late(i, result) {
                            follow_ups.push(f);
                        }
                    }
                    Some(()) = follow_ups.next() => {}
                    else => break,
                }
            }
        });
    }
}
