//! The integration tests of the Redis backend against throwaway servers,
//! clusters and Sentinel sets.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod auth;
mod batch;
mod cluster;
mod cluster_failover;
mod counter;
mod foreign_locks;
mod restart;
mod sentinel_failover;
mod sentinel_patience;
mod timeouts;
mod wait;
mod wakeups;

use fencelock_redis::RedisBackend;
use fencelock_testkit::{Patience, TestResult};

/// The budget of a test against the deployment at `url` (a server, a
/// cluster or a Sentinel set): the machine's scheduling delay and the worst
/// round trip through a backend opened on `url` as it is.
pub(crate) async fn patience(url: &str) -> TestResult<Patience> {
    let probe = RedisBackend::connect(url).await?;
    Ok(Patience::against(&probe).await)
}

pub(crate) use fencelock_testkit::patience::ms;
