//! The conformance suite against throwaway `etcd` servers: one shared single-
//! member server for ordinary cases, each case under its own key prefix; a
//! server of its own for each case that restarts it. Stores are opened
//! through the crate's driver.
//!
//! The binary runs the other layouts' suites too (`etcd_layout.rs`,
//! `serve.rs`): one link for all.
//!
//! Time: the harness measures a budget against each case's store and the
//! cases take their TTLs and bounds from it (`fencelock_testkit::suite`,
//! `fencelock_testkit::patience`); nothing here is a figure of time.

mod etcd_layout;
mod serve;

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster,
        url_factory::{UrlFactory, UrlServer},
    },
    Suite,
};

/// The suite named `name` on servers of `S`, opened through the driver.
fn suite<S: UrlServer>(name: &'static str) -> Suite {
    Suite::new(UrlFactory::<S>::new(
        name,
        |url| Box::pin(async move { fencelock_etcd::EtcdDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_etcd::EtcdDriver.open_fence(&url).await })),
    ))
}

fn main() -> ExitCode {
    // `run_suites` owns the factories and drops them (stopping the servers)
    // before returning the exit code.
    fencelock_testkit::run_suites([
        suite::<EtcdCluster>("etcd"),
        suite::<etcd_layout::EtcdLayout>("etcd-layout"),
        serve::suite(),
    ])
}
