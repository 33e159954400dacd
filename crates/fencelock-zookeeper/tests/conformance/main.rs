//! The conformance suite against throwaway ZooKeeper servers: one shared
//! standalone server for ordinary cases, each case under its own node prefix;
//! a server of its own for each case that restarts it. Stores are opened
//! through the crate's driver.
//!
//! The binary runs the other layouts' suites too (`curator.rs`): one link for
//! all.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

mod curator;

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::{
    servers::{url_factory::UrlFactory, zookeeper::ZkServer},
    Suite,
};

fn main() -> ExitCode {
    // `run_suites` owns the factories and drops them (stopping the servers)
    // before returning the exit code.
    fencelock_testkit::run_suites([
        Suite::new(UrlFactory::<ZkServer>::new(
            "zookeeper",
            |url| Box::pin(async move { fencelock_zookeeper::ZkDriver.open_backend(&url).await }),
            Some(|url| {
                Box::pin(async move { fencelock_zookeeper::ZkDriver.open_fence(&url).await })
            }),
        )),
        curator::suite(),
    ])
}
