//! The conformance suite through Redis Sentinel (`redis+sentinel://`): a
//! master, a replica and three Sentinels, shared by ordinary cases, each
//! case under its own key prefix; a persistent set of its own for each case
//! that restarts it. Stores are opened through the crate's driver.

use fencelock_core::Driver;
use fencelock_testkit::servers::{redis_sentinel::RedisSentinel, url_factory::UrlFactory};

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(UrlFactory::<RedisSentinel>::new(
        "redis-sentinel",
        |url| Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_redis::RedisDriver.open_fence(&url).await })),
    ))
}
