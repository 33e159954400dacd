//! Starts one throwaway server for `fencelock bench`, with production
//! durability (PostgreSQL fsync on, MariaDB `innodb_flush_log_at_trx_commit=1`),
//! on a free loopback port; prints its URL and keeps it until standard input
//! ends (Enter, Ctrl-D, or the end of a pipe), then stops it and deletes its
//! data.
//!
//! ```text
//! cargo run -p fencelock-testkit --example bench_server -- postgres|mariadb|redis|redis-cluster|redlock [NODES]|etcd|zookeeper
//! ```

use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster,
        mariadb::{self, MariaDbServer},
        postgres::{self, PostgresServer},
        redis::RedisServer,
        redis_cluster::RedisCluster,
        redis_set::{RedisSet, DEFAULT_NODES},
        zookeeper::ZkServer,
    },
    TestResult,
};

fn serve(url: String) {
    println!("{url}");
    let _ = std::io::stdin().read_line(&mut String::new());
}

fn main() -> TestResult {
    match std::env::args().nth(1).as_deref() {
        Some("postgres") => {
            let server = PostgresServer::start_with(postgres::Durability::Production)?;
            serve(server.url("postgres"));
        }
        Some("mariadb") => {
            let server = MariaDbServer::start_with(mariadb::Durability::Production)?;
            serve(server.url("mysql"));
        }
        Some("redis") => serve(RedisServer::start()?.url()),
        Some("redis-cluster") => serve(RedisCluster::start()?.url()),
        Some("redlock") => {
            let nodes = match std::env::args().nth(2) {
                Some(n) => n.parse().map_err(|_| format!("{n:?} is not a node count"))?,
                None => DEFAULT_NODES,
            };
            serve(RedisSet::start(nodes)?.url())
        }
        Some("etcd") => serve(EtcdCluster::start()?.url()),
        Some("zookeeper") => serve(ZkServer::start()?.url()),
        _ => {
            return Err(
                "usage: bench_server postgres|mariadb|redis|redis-cluster|redlock [NODES]|etcd|zookeeper"
                    .into(),
            )
        }
    }
    Ok(())
}
