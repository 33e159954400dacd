//! `balance=first`: every request to the first endpoint that answers, in
//! the URL's order, the others only while it does not.
//!
//! The etcd client spreads its requests over every endpoint it has. Across
//! data centres that sends most requests to members far away: a client
//! beside the leader paid a cycle of 5.4 round trips where the member
//! beside it would have needed 2.2 (docs/multi-dc.md). The client's
//! balanced channel takes endpoints in and out while it runs, so the
//! client keeps exactly one: the *steward*, one task per client, probes the
//! one in use every [`PROBE_EVERY`] with a status request of its own, and
//! when it does not answer within the timeout moves the channel to the
//! first endpoint, in the URL's order, that does. While an earlier
//! endpoint than the one in use is down, it is probed too, and taken back
//! once it answered [`BACK_AFTER`] probes in a row, so that a member that
//! flaps does not pull the traffic back and forth.

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
    let stop = CancellationToken::new();
    let steward = steward(client.clone(), probes, current, timeout);
    let cancelled = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = cancelled.cancelled() => {}
            () = steward => {}
        }
    });
    Ok((client, std::sync::Arc::new(stop.drop_guard())))
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
