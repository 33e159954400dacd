//! The conformance suite against throwaway servers: one shared server for
//! the binary with a fresh table prefix per case, and a server of its own for
//! each case that restarts it. Stores are opened through the crate's URL
//! entry points.

use std::{process::ExitCode, sync::Mutex};

use fencelock_core::Driver;
use fencelock_testkit::servers::{mariadb::MariaDbServer, url_factory::UrlFactory};

fn main() -> ExitCode {
    // `run` owns the factory and drops it (stopping the servers) before
    // returning the exit code.
    fencelock_testkit::run(UrlFactory::<Mutex<MariaDbServer>>::new(
        "mysql",
        |url| Box::pin(async move { fencelock_mysql::MySqlDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_mysql::MySqlDriver.open_fence(&url).await })),
    ))
}
