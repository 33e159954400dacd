//! The conformance suite against throwaway `redis-server`s: one shared server
//! (no persistence) for ordinary cases, each case under its own key prefix; a
//! persistent server of its own (AOF, fsync always) for each case that
//! restarts it. Stores are opened through the crate's driver.
//!
//! The binary runs the other layouts' suites too (`plain.rs`, `cluster.rs`,
//! `sentinel.rs`): one link for all.

mod cluster;
mod plain;
mod sentinel;

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::{
    servers::{redis::RedisServer, url_factory::UrlFactory},
    Suite,
};

fn main() -> ExitCode {
    // `run_suites` owns the factories and drops them (stopping the servers)
    // before returning the exit code.
    fencelock_testkit::run_suites([
        Suite::new(UrlFactory::<RedisServer>::new(
            "redis",
            |url| Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await }),
            Some(|url| {
                Box::pin(async move { fencelock_redis::RedisDriver.open_fence(&url).await })
            }),
        )),
        plain::suite(),
        cluster::suite(),
        sentinel::suite(),
    ])
}
