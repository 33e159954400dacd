//! The conformance suite against throwaway servers: one shared server for
//! the binary with a fresh table prefix per case, and a server of its own for
//! each case that restarts it. Stores are opened through the crate's URL
//! entry points.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

use std::{process::ExitCode, sync::Mutex};

use fencelock_core::Driver;
use fencelock_testkit::servers::{postgres::PostgresServer, url_factory::UrlFactory};

fn main() -> ExitCode {
    // `run` owns the factory and drops it (stopping the servers) before
    // returning the exit code.
    fencelock_testkit::run(UrlFactory::<Mutex<PostgresServer>>::new(
        "postgres",
        |url| Box::pin(async move { fencelock_postgres::PostgresDriver.open_backend(&url).await }),
        Some(|url| {
            Box::pin(async move { fencelock_postgres::PostgresDriver.open_fence(&url).await })
        }),
    ))
}
