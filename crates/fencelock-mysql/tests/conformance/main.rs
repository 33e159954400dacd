//! The conformance suite against throwaway servers: one shared server for the
//! binary with a fresh table prefix per case, and a server of its own for
//! each case that restarts it. Stores are opened through the crate's URL
//! entry points.
//!
//! The binary runs the other layouts' suites too (`mysql8_mode.rs`): one link
//! for all.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

mod mysql8_mode;

use std::{process::ExitCode, sync::Mutex};

use fencelock_core::Driver;
use fencelock_testkit::{
    servers::{
        mariadb::MariaDbServer,
        url_factory::{UrlFactory, UrlServer},
    },
    Suite,
};

/// The suite named `name` on servers of `S`, opened through the driver.
fn suite<S: UrlServer>(name: &'static str) -> Suite {
    Suite::new(UrlFactory::<S>::new(
        name,
        |url| Box::pin(async move { fencelock_mysql::MySqlDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_mysql::MySqlDriver.open_fence(&url).await })),
    ))
}

fn main() -> ExitCode {
    // `run_suites` owns the factories and drops them (stopping the servers)
    // before returning the exit code.
    fencelock_testkit::run_suites([
        suite::<Mutex<MariaDbServer>>("mysql"),
        suite::<mysql8_mode::Mysql8Mode>("mysql8-mode"),
    ])
}
