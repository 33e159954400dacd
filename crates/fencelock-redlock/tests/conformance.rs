//! The conformance suite against three throwaway `redis-server`s: one
//! shared set (no persistence) for ordinary cases, each case under its own
//! key prefix; a persistent set of its own (AOF, fsync always) for each case
//! that restarts it (all three nodes at once).
//!
//! The backend has no fence of its own: the fence cases fence with the
//! Redis backend's fence, kept on the first node's server under the case's
//! prefix, as a resource stored in that Redis would be.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::servers::{redis_set::RedisSet, url_factory::UrlFactory};

/// `redis://FIRST-NODE/0?prefix=P` for `redlock://FIRST-NODE,…?prefix=P&…`.
fn fence_url(url: &str) -> String {
    let rest = url.strip_prefix("redlock://").unwrap_or(url);
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let first = hosts.split(',').next().unwrap_or(hosts);
    let prefix = query
        .split('&')
        .find(|p| p.starts_with("prefix="))
        .unwrap_or("prefix=fencelock");
    format!("redis://{first}/0?{prefix}")
}

fn main() -> ExitCode {
    fencelock_testkit::run(UrlFactory::<RedisSet>::new(
        "redlock",
        |url| Box::pin(async move { fencelock_redlock::RedlockDriver.open_backend(&url).await }),
        Some(|url| {
            Box::pin(async move {
                fencelock_redis::RedisDriver
                    .open_fence(&fence_url(&url))
                    .await
            })
        }),
    ))
}
