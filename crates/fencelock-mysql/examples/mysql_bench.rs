//! Acquire+release cycles/s (1 and 8 clients, distinct keys), the engine's
//! own limit for the very statements of a cycle, and hand-off latency on one
//! contended key, against a durable MariaDB
//! (`innodb_flush_log_at_trx_commit=1`).
//!
//! ```text
//! cargo run --release -p fencelock-mysql --example mysql_bench
//! ```
//!
//! Starts a throwaway MariaDB server on a free loopback port. The engine's
//! limit is measured in the same run, on the same server and table: the
//! library's three statements of a cycle (acquire = upsert under `GET_LOCK`,
//! then the result `SELECT` with `RELEASE_LOCK`; release = `DELETE`), taken
//! from the library by `fencelock_mysql::cycle_statements`, prepared, on ONE `MySqlConnection`, no pool,
//! no library. Two more raw runs go through a `MySqlPool` sized as the
//! library's (10), checked out as the library does, with and without sqlx's
//! ping on every checkout (`test_before_acquire`; sqlx also pings on every
//! return, in the background), to show what the pool costs. MariaDB has no
//! wake-ups: a waiter polls with jittered backoff (5 ms doubling to 1 s,
//! capped by the holder's remaining lease), so the hand-off is measured
//! after two hold times. Prints figures; asserts nothing.

use std::{
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use fencelock_core::Backend;
use fencelock_testkit::{
    bench::{cycle_rate, cycle_rate_for, handoff_after, quantile},
    servers::mariadb::{Durability, MariaDbServer},
    TestResult,
};
use sqlx::{
    mysql::{MySqlConnectOptions, MySqlPoolOptions},
    ConnectOptions, MySqlConnection, MySqlPool, Row,
};

const TTL: Duration = Duration::from_secs(30);
/// How long each throughput measurement runs.
const RUN: Duration = Duration::from_secs(10);
const PREFIX: &str = "bench_";

/// The three statements of a cycle, exactly as the backend sends them.
struct Statements {
    acquire: String,
    acquire_result: String,
    release: String,
}

impl Statements {
    fn new(prefix: &str) -> Self {
        let (acquire, acquire_result, release) = fencelock_mysql::cycle_statements(prefix);
        Self {
            acquire,
            acquire_result,
            release,
        }
    }
}

/// One raw cycle with the library's binds: upsert and result SELECT on one
/// session, then the DELETE with the token it returned.
async fn raw_cycle(conn: &mut MySqlConnection, sql: &Statements, key: &str) -> TestResult {
    sqlx::query(&sql.acquire)
        .bind(key)
        .bind("raw-owner")
        .bind(key)
        .bind(None::<&str>)
        .bind(None::<serde_json::Value>)
        .bind(i64::try_from(TTL.as_micros())?)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(&sql.acquire_result)
        .bind(key)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    if row.try_get::<Option<bool>, _>("won")? != Some(true) {
        return Err("raw acquire: not won".into());
    }
    let token: u64 = row.try_get("token")?;
    let deleted = sqlx::query(&sql.release)
        .bind(key)
        .bind("raw-owner")
        .bind(token)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if deleted != 1 {
        return Err("raw release: nothing deleted".into());
    }
    Ok(())
}

/// Raw cycles/s for `RUN` on one connection: a `MySqlConnection` of its own
/// (`pool == None`), or checked out of `pool` for the acquire's two
/// statements and again for the release, as the library does.
async fn raw_rate(
    connect: &MySqlConnectOptions,
    pool: Option<&MySqlPool>,
    key: &str,
) -> TestResult<f64> {
    let sql = Statements::new(PREFIX);
    let mut own = match pool {
        None => Some(connect.connect().await?),
        Some(_) => None,
    };
    let mut warm_up = 200;
    let mut started = Instant::now();
    let mut done = 0usize;
    loop {
        match (own.as_mut(), pool) {
            (Some(conn), _) => raw_cycle(conn, &sql, key).await?,
            (None, Some(pool)) => raw_cycle_pooled(pool, &sql, key).await?,
            (None, None) => return Err("no connection".into()),
        }
        if warm_up > 0 {
            warm_up -= 1;
            if warm_up == 0 {
                started = Instant::now();
            }
            continue;
        }
        done += 1;
        if started.elapsed() >= RUN {
            return Ok(done as f64 / started.elapsed().as_secs_f64());
        }
    }
}

/// [`raw_cycle`] with the library's pool use: one checkout for the two
/// acquire statements, one for the release.
async fn raw_cycle_pooled(pool: &MySqlPool, sql: &Statements, key: &str) -> TestResult {
    let mut conn = pool.acquire().await?;
    sqlx::query(&sql.acquire)
        .bind(key)
        .bind("raw-owner")
        .bind(key)
        .bind(None::<&str>)
        .bind(None::<serde_json::Value>)
        .bind(i64::try_from(TTL.as_micros())?)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(&sql.acquire_result)
        .bind(key)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    drop(conn);
    if row.try_get::<Option<bool>, _>("won")? != Some(true) {
        return Err("raw acquire: not won".into());
    }
    let token: u64 = row.try_get("token")?;
    let deleted = sqlx::query(&sql.release)
        .bind(key)
        .bind("raw-owner")
        .bind(token)
        .execute(pool)
        .await?
        .rows_affected();
    if deleted != 1 {
        return Err("raw release: nothing deleted".into());
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> TestResult {
    let server =
        tokio::task::spawn_blocking(|| MariaDbServer::start_with(Durability::Production)).await??;
    let result = async {
        let mut admin = MySqlConnectOptions::from_str(&server.url("mysql"))?
            .connect()
            .await?;
        sqlx::query("CREATE DATABASE bench")
            .execute(&mut admin)
            .await?;
        let flush: (String, String) =
            sqlx::query_as("SHOW GLOBAL VARIABLES LIKE 'innodb_flush_log_at_trx_commit'")
                .fetch_one(&mut admin)
                .await?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut admin)
            .await?;
        println!("MariaDB {version}, {} = {}", flush.0, flush.1);
        let url = format!("{}?table_prefix={PREFIX}", server.url("bench"));
        let connect = MySqlConnectOptions::from_str(&server.url("bench"))?;

        // The library, 1 client, measured before and after the raw runs.
        let backend = fencelock_mysql::open_backend(&url).await?;
        let one: Vec<Arc<dyn Backend>> = vec![Arc::clone(&backend)];
        cycle_rate(&one, 1, 300, TTL).await?; // warm-up
        let lib_a = cycle_rate_for(&one, 1, RUN, TTL).await?;
        println!("fencelock, 1 client (run A):       {lib_a:.0} cycles/s");

        let raw = raw_rate(&connect, None, "raw-conn").await?;
        println!("raw sqlx, 1 MySqlConnection:       {raw:.0} cycles/s");
        for test_before_acquire in [true, false] {
            let pool = MySqlPoolOptions::new()
                .max_connections(10)
                .test_before_acquire(test_before_acquire)
                .connect_with(connect.clone())
                .await?;
            let pooled = raw_rate(&connect, Some(&pool), "raw-pool").await?;
            pool.close().await;
            let how = if test_before_acquire {
                "ping on checkout (sqlx default)"
            } else {
                "no ping"
            };
            println!("raw sqlx via MySqlPool, {how}: {pooled:.0} cycles/s");
        }

        let lib_b = cycle_rate_for(&one, 1, RUN, TTL).await?;
        println!("fencelock, 1 client (run B):       {lib_b:.0} cycles/s");
        let lib = (lib_a + lib_b) / 2.0;
        println!(
            "=> fencelock 1 client (mean {lib:.0}) = {:.0}% of raw",
            100.0 * lib / raw
        );

        let many = cycle_rate_for(&one, 8, RUN, TTL).await?;
        println!("fencelock, 8 clients (one backend, pool of 10): {many:.0} cycles/s");

        for (hold, rounds) in [
            (Duration::from_millis(5), 300),
            (Duration::from_millis(100), 100),
        ] {
            let a = fencelock_mysql::open_backend(&url).await?;
            let b = fencelock_mysql::open_backend(&url).await?;
            let lat = handoff_after(a, b, rounds, TTL, hold).await?;
            println!(
                "hand-off (release -> waiter granted, backoff polling), holder releases {hold:?} \
                 after the waiter starts, {rounds} rounds: p50 {:?}, p99 {:?}",
                quantile(&lat, 0.5),
                quantile(&lat, 0.99)
            );
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    tokio::task::spawn_blocking(move || drop(server)).await?;
    result
}
