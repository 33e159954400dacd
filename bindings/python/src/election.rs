//! Elections: campaigning for a leadership, the current leader, and
//! observing the leader's changes ([`LeaderWatch`]).

use fencelock::{Leadership, LockClient};
use pyo3::prelude::*;

use crate::{
    convert::{json, seconds, to_json, Json},
    errors::core,
    watch::LeaderWatch,
};

/// Campaigns in election `name` (the arguments of `Client.campaign`):
/// the leadership, once won.
pub(crate) async fn campaign(
    client: &LockClient,
    name: String,
    ttl: Option<f64>,
    wait: Option<f64>,
    value: Option<String>,
    renew_every: Option<f64>,
) -> fencelock::Result<Leadership> {
    let mut election = client.election(name);
    if let Some(ttl) = ttl {
        election = election.ttl(seconds("ttl", ttl)?);
    }
    if let Some(value) = json("value", value)? {
        election = election.value(value);
    }
    if let Some(period) = renew_every {
        election = election.renew_every(seconds("renew_every", period)?);
    }
    match wait {
        Some(wait) => election.campaign_for(seconds("wait", wait)?).await,
        None => election.campaign().await,
    }
}

/// The current leader of election `name`, as a dict.
pub(crate) async fn leader(client: LockClient, name: String) -> PyResult<Option<Json>> {
    let leader = core(client.election(name).leader().await)?;
    leader.map(to_json).transpose()
}

/// Follows the leaders of election `name`.
pub(crate) async fn observe(
    client: LockClient,
    name: String,
    blocking: bool,
) -> PyResult<LeaderWatch> {
    let watch = core(client.election(name).observe().await)?;
    Ok(LeaderWatch::new(watch, blocking))
}
