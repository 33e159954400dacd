//! The conformance suite against throwaway ZooKeeper servers: one shared
//! standalone server for ordinary cases, each case under its own node
//! prefix; a server of its own for each case that restarts it. Stores are
//! opened through the crate's driver.

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::servers::{url_factory::UrlFactory, zookeeper::ZkServer};

fn main() -> ExitCode {
    // `run` owns the factory and drops it (killing the servers) before
    // returning the exit code.
    fencelock_testkit::run(UrlFactory::<ZkServer>::new(
        "zookeeper",
        |url| Box::pin(async move { fencelock_zookeeper::ZkDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_zookeeper::ZkDriver.open_fence(&url).await })),
    ))
}
