//! The conformance suite against a throwaway Redis Cluster (three
//! primaries, three replicas): one shared cluster for ordinary cases, each
//! case under its own key prefix; a persistent cluster of its own for each
//! case that restarts it. Stores are opened through the crate's driver with
//! `redis+cluster://` URLs.

use fencelock_core::Driver;
use fencelock_testkit::servers::{redis_cluster::RedisCluster, url_factory::UrlFactory};

pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(UrlFactory::<RedisCluster>::new(
        "redis-cluster",
        |url| Box::pin(async move { fencelock_redis::RedisDriver.open_backend(&url).await }),
        Some(|url| Box::pin(async move { fencelock_redis::RedisDriver.open_fence(&url).await })),
    ))
}
