//! The conformance suite against throwaway Redis deployments, one suite per
//! way of running Redis, each with one shared deployment for ordinary cases
//! (each case under its own key prefix, or in the `plain` layout a database
//! of its own) and a persistent one of its own for each case that restarts
//! it. Stores are opened through the crate's driver.
//!
//! - `redis`: one `redis-server` (no persistence when shared; AOF, fsync
//!   always, when dedicated).
//! - `redis-plain`: the same with `?layout=plain`, leases at the users' keys
//!   themselves.
//! - `redis-cluster`: a Redis Cluster of three primaries and three replicas,
//!   through `redis+cluster://` URLs.
//! - `redis-sentinel`: a master, a replica and three Sentinels, through
//!   `redis+sentinel://` URLs.
//!
//! Time: the cases are the test kit's; the harness measures a patience per
//! case against the case's store and every case takes its TTLs and bounds
//! from it (`fencelock_testkit::patience`). This file sets no figure.

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::{
    servers::{
        redis::{PlainRedis, RedisServer},
        redis_cluster::RedisCluster,
        redis_sentinel::RedisSentinel,
        url_factory::{UrlFactory, UrlServer},
    },
    Suite,
};

/// The suite named `name` on deployments of `S`, opened through the driver.
fn suite<S: UrlServer>(name: &'static str) -> Suite {
    Suite::new(UrlFactory::<S>::new(
        name,
        |url| Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_redis::RedisDriver.open_fence(&url).await })),
    ))
}

fn main() -> ExitCode {
    // `run_suites` owns the factories and drops them (stopping the servers)
    // before returning the exit code.
    fencelock_testkit::run_suites([
        suite::<RedisServer>("redis"),
        suite::<PlainRedis>("redis-plain"),
        suite::<RedisCluster>("redis-cluster"),
        suite::<RedisSentinel>("redis-sentinel"),
    ])
}
