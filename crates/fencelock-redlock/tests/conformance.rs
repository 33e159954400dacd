//! The conformance suite against three throwaway `redis-server`s: one
//! shared set (no persistence) for ordinary cases, each case under its own
//! key prefix; a persistent set of its own (AOF, fsync always) for each case
//! that restarts it (all three nodes at once).

use std::process::ExitCode;

use fencelock_core::Driver;
use fencelock_testkit::servers::{redis_set::RedisSet, url_factory::UrlFactory};

fn main() -> ExitCode {
    fencelock_testkit::run(UrlFactory::<RedisSet>::new(
        "redlock",
        |url| Box::pin(async move { fencelock_redlock::RedlockDriver.open_backend(&url).await }),
        None,
    ))
}
