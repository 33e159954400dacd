//! The integration tests of the ZooKeeper backend against throwaway servers
//! and ensembles.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod balance;
mod changes;
mod cluster;
mod interop;
mod reconnect;
mod release;
mod timeouts;
mod wake;

use fencelock_testkit::{Patience, TestResult};
use fencelock_zookeeper::ZkBackend;

/// The budget of a test against the ZooKeeper at `url`: the machine's
/// scheduling delay and the worst round trip through a backend opened on
/// `url`.
pub(crate) async fn patience(url: &str) -> TestResult<Patience> {
    let probe = ZkBackend::connect(url).await?;
    Ok(Patience::against(&probe).await)
}
