//! Which endpoints a client's requests go to, kept up to date by a
//! *steward*: one task per client that probes the endpoints every
//! [`PROBE_EVERY`] with status requests of its own, and takes an endpoint
//! out of the client's balanced channel when it does not answer, back in
//! once it answered [`BACK_AFTER`] probes in a row (so that a member that
//! flaps does not pull the traffic back and forth).
//!
//! - `balance=all` (the default): every endpoint that answers. A member
//!   that stops answering (stopped, wedged, or cut off by a silent network)
//!   keeps its connections open, so the channel, which picks endpoints at
//!   random, would go on handing it about a third of all requests, each
//!   waiting out its time-out, until the HTTP/2 keep-alive gave up on it
//!   seconds later, and a new client would connect to it again. Its probe
//!   fails within [`probe_within`] instead, and it is taken out. Opening
//!   probes every endpoint first and starts with the ones that answer, so
//!   a client opened while a member is silent never uses it.
//! - `balance=first`: every request to the first endpoint that answers, in
//!   the URL's order, the others only while it does not. The etcd client
//!   spreads its requests over every endpoint it has; across data centres
//!   that sends most requests to members far away: a client beside the
//!   leader paid a cycle of 5.4 round trips where the member beside it
//!   would have needed 2.2 (docs/multi-dc.md). The steward probes the one
//!   in use and, when it does not answer within the timeout, moves the
//!   channel to the first endpoint, in the URL's order, that does. While an
//!   earlier endpoint than the one in use is down, it is probed too, and
//!   taken back once it answered [`BACK_AFTER`] probes in a row.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use futures_util::future::join_all;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::{bounded, map};
use fencelock_core::Result;

/// How often the endpoint in use (and any earlier one that is down) is
/// probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Probes in a row an earlier endpoint must answer before it is used again.
const BACK_AFTER: u32 = 2;

/// Bound on one probe with `balance=all`: a healthy member answers its
/// status in milliseconds, and a silent one should be out of the channel
/// long before a renewal's patience ends.
pub(crate) fn probe_within(timeout: Duration) -> Duration {
    timeout.min(Duration::from_secs(1))
}

/// How long after a member falls silent the `balance=all` steward has
/// taken it out of the channel, while the other members answer their
/// probes at once: the silence begins just after a probe round, the next
/// one starts [`PROBE_EVERY`] later and waits out its bound.
pub(crate) fn out_within(timeout: Duration) -> Duration {
    PROBE_EVERY + probe_within(timeout)
}

/// Stops the steward when the last clone of its client's owner is dropped.
pub(crate) type Steward = std::sync::Arc<DropGuard>;

/// One endpoint, reached by a client of its own for the probes.
struct Probe {
    endpoint: String,
    client: Client,
    /// Probes answered in a row.
    answered: u32,
}

impl Probe {
    /// Whether the endpoint answers its status within `timeout`; counts
    /// the answers in a row.
    async fn answers(&mut self, timeout: Duration) -> bool {
        let mut c = self.client.clone();
        let ok = bounded(timeout, async move { c.status().await })
            .await
            .is_ok();
        self.answered = if ok { self.answered + 1 } else { 0 };
        ok
    }
}

/// Connects a client that sends every request to the first of
/// `endpoints` that answers its status within `timeout`, and starts its
/// steward (see the module docs).
pub(crate) async fn connect(
    endpoints: &[String],
    options: ConnectOptions,
    timeout: Duration,
) -> Result<(Client, Steward)> {
    let mut probes = probes(endpoints, &options, timeout).await?;
    let mut current = 0;
    for (i, probe) in probes.iter_mut().enumerate() {
        if probe.answers(timeout).await {
            current = i;
            break;
        }
    }
    let client = bounded(
        timeout,
        Client::connect([&probes[current].endpoint], Some(options)),
    )
    .await
    .map_err(|e| map("connect", e))?;
    let steward = spawn(steward(client.clone(), probes, current, timeout));
    Ok((client, steward))
}

/// Connects a client over those of `endpoints` that answer their status
/// within [`probe_within`] (all of them if none does: the caller's own
/// status request then says why), and starts its steward
/// ([`steward_all`]).
pub(crate) async fn connect_all(
    endpoints: &[String],
    options: ConnectOptions,
    timeout: Duration,
) -> Result<(Client, Steward)> {
    let mut probes = probes(endpoints, &options, timeout).await?;
    let within = probe_within(timeout);
    join_all(probes.iter_mut().map(|p| p.answers(within))).await;
    let mut used: Vec<bool> = probes.iter().map(|p| p.answered > 0).collect();
    if !used.contains(&true) {
        used.fill(true);
    }
    let first: Vec<&str> = probes
        .iter()
        .zip(&used)
        .filter(|(_, &used)| used)
        .map(|(p, _)| p.endpoint.as_str())
        .collect();
    let client = bounded(timeout, Client::connect(first, Some(options)))
        .await
        .map_err(|e| map("connect", e))?;
    let steward = spawn(steward_all(client.clone(), probes, used, within));
    Ok((client, steward))
}

/// One probe per endpoint, each a client of its own (which connects
/// lazily).
async fn probes(
    endpoints: &[String],
    options: &ConnectOptions,
    timeout: Duration,
) -> Result<Vec<Probe>> {
    let mut probes = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let client = bounded(timeout, Client::connect([endpoint], Some(options.clone())))
            .await
            .map_err(|e| map("connect", e))?;
        probes.push(Probe {
            endpoint: endpoint.clone(),
            client,
            answered: 0,
        });
    }
    Ok(probes)
}

/// Runs `steward` until the last clone of the returned guard is dropped.
fn spawn(steward: impl std::future::Future<Output = ()> + Send + 'static) -> Steward {
    let stop = CancellationToken::new();
    let cancelled = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = cancelled.cancelled() => {}
            () = steward => {}
        }
    });
    std::sync::Arc::new(stop.drop_guard())
}

/// Keeps `client` on every endpoint that answers (`used` says which it
/// has now); runs until it is cancelled.
async fn steward_all(
    client: Client,
    mut probes: Vec<Probe>,
    mut used: Vec<bool>,
    within: Duration,
) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        join_all(probes.iter_mut().map(|p| p.answers(within))).await;
        if probes.iter().all(|p| p.answered == 0) {
            // Nothing answers (this client's own network, or a load that
            // slows every member): nothing better to move to.
            continue;
        }
        // Additions first, so that the channel is never empty.
        for i in 0..probes.len() {
            if !used[i] && probes[i].answered >= BACK_AFTER {
                match client.add_endpoint(&probes[i].endpoint).await {
                    Ok(()) => {
                        tracing::info!(endpoint = %probes[i].endpoint, "etcd: an endpoint answers again; requests go to it too");
                        used[i] = true;
                    }
                    Err(e) => {
                        tracing::warn!(endpoint = %probes[i].endpoint, error = %e, "etcd: could not add an endpoint back")
                    }
                }
            }
        }
        for i in 0..probes.len() {
            let another = (0..probes.len()).any(|j| j != i && used[j] && probes[j].answered > 0);
            if used[i] && probes[i].answered == 0 && another {
                match client.remove_endpoint(&probes[i].endpoint).await {
                    Ok(()) => {
                        tracing::info!(endpoint = %probes[i].endpoint, "etcd: an endpoint does not answer; requests go to the others");
                        used[i] = false;
                    }
                    Err(e) => {
                        tracing::warn!(endpoint = %probes[i].endpoint, error = %e, "etcd: could not take an endpoint out")
                    }
                }
            }
        }
    }
}

/// Keeps `client` on the first endpoint that answers (see the module
/// docs); runs until it is cancelled.
async fn steward(client: Client, mut probes: Vec<Probe>, mut current: usize, timeout: Duration) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        // The endpoint in use and every earlier one (down when it was
        // left), at once: a silent one costs the timeout, not a tick each.
        join_all(probes[..=current].iter_mut().map(|p| p.answers(timeout))).await;
        let target = match (0..current).find(|&i| probes[i].answered >= BACK_AFTER) {
            Some(earlier) => earlier,
            None if probes[current].answered > 0 => continue,
            None => {
                // The one in use is down: the first other that answers.
                join_all(probes[current + 1..].iter_mut().map(|p| p.answers(timeout))).await;
                match (0..probes.len()).find(|&i| i != current && probes[i].answered > 0) {
                    Some(other) => other,
                    None => continue,
                }
            }
        };
        // The new endpoint first, so that the channel is never empty.
        let added = client.add_endpoint(&probes[target].endpoint).await;
        let removed = client.remove_endpoint(&probes[current].endpoint).await;
        match (added, removed) {
            (Ok(()), Ok(())) => {
                tracing::info!(
                    from = %probes[current].endpoint,
                    to = %probes[target].endpoint,
                    "etcd: requests move to another endpoint (balance=first)"
                );
                current = target;
            }
            (added, removed) => {
                tracing::warn!(
                    added = ?added.err(),
                    removed = ?removed.err(),
                    "etcd: could not move requests to another endpoint"
                );
            }
        }
    }
}
