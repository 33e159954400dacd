//! The conformance suite against throwaway `etcd` servers: one shared
//! single-member server for ordinary cases, each case under its own key
//! prefix; a server of its own for each case that restarts it. Stores are
//! opened through the crate's driver.

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::servers::{etcd::EtcdCluster, url_factory::UrlFactory};

fn main() -> ExitCode {
    // `run` owns the factory and drops it (killing the servers) before
    // returning the exit code.
    fencelock_testkit::run(UrlFactory::<EtcdCluster>::new(
        "etcd",
        |url| Box::pin(async move { fencelock_etcd::EtcdDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_etcd::EtcdDriver.open_fence(&url).await })),
    ))
}
