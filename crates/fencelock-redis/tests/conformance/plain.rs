//! The conformance suite in the `plain` layout (`?layout=plain`, leases at
//! the users' keys themselves) against throwaway `redis-server`s, each case
//! in a database of its own. Stores are opened through the crate's driver.

use fencelock_core::Driver;
use fencelock_testkit::servers::{redis::PlainRedis, url_factory::UrlFactory};

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(UrlFactory::<PlainRedis>::new(
        "redis-plain",
        |url| Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_redis::RedisDriver.open_fence(&url).await })),
    ))
}
