//! Acquire+release cycles/s (1 and 8 clients, distinct keys), the engine's
//! own limit for the very statements of a cycle, and hand-off latency on one
//! contended key, durable (`synchronous_commit=on`, fsync on) and relaxed
//! (`synchronous_commit=off`).
//!
//! ```text
//! cargo run --release -p fencelock-postgres --example postgres_bench
//! ```
//!
//! Starts a throwaway PostgreSQL server with production durability (fsync
//! on) on a free loopback port. The engine's limit is measured in the same
//! run, on the same server and tables, two ways:
//!
//! * raw sqlx: the library's acquire and release statements (taken from
//!   the library by `fencelock_postgres::cycle_statements`), prepared, on ONE `PgConnection`, no pool, no
//!   listener, no library;
//! * `pgbench -n -M prepared -c 1 -T 10` with a custom script holding the
//!   same two statements (a random key per transaction).
//!
//! More raw runs split the library's overhead: the raw loop through a
//! `PgPool` sized as the library's (10), checked out per statement as the
//! library does, with and without sqlx's ping on every checkout
//! (`test_before_acquire`; sqlx also pings on every return, in the
//! background), and the raw loop on one connection while another session
//! LISTENs on the release channel (as the library's wake-up listener does).
//! Prints figures; asserts nothing.

use std::{
    process::Command,
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use fencelock_core::Backend;
use fencelock_testkit::{
    bench::{cycle_rate, cycle_rate_for, handoff, quantile},
    servers::{
        find_binary,
        postgres::{Durability, PostgresServer},
    },
    TestResult,
};
use sqlx::{
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
    ConnectOptions, PgConnection, PgPool, Row,
};

const TTL: Duration = Duration::from_secs(30);
/// How long each throughput measurement runs.
const RUN: Duration = Duration::from_secs(10);
const HANDOFFS: usize = 300;

/// Where the raw statements run.
enum Exec<'a> {
    Conn(&'a mut PgConnection),
    Pool(&'a PgPool),
}

/// One raw cycle: the acquire statement with the library's binds and fetch
/// (`fetch_optional`), then the release statement with the token it
/// returned (`fetch_all`), as `PostgresBackend` sends them.
async fn raw_cycle(ex: &mut Exec<'_>, acquire: &str, release: &str, key: &str) -> TestResult {
    let query = sqlx::query(acquire)
        .bind(key)
        .bind("raw-owner")
        .bind(None::<&str>)
        .bind(None::<serde_json::Value>)
        .bind(i64::try_from(TTL.as_micros())?);
    let row = match ex {
        Exec::Conn(c) => query.fetch_optional(&mut **c).await?,
        Exec::Pool(p) => query.fetch_optional(*p).await?,
    }
    .ok_or("raw acquire: no row")?;
    if !row.try_get::<bool, _>("won")? {
        return Err("raw acquire: own key held".into());
    }
    let token: i64 = row.try_get("token")?;
    let query = sqlx::query(release).bind(key).bind("raw-owner").bind(token);
    let rows = match ex {
        Exec::Conn(c) => query.fetch_all(&mut **c).await?,
        Exec::Pool(p) => query.fetch_all(*p).await?,
    };
    if rows.len() != 1 {
        return Err("raw release: nothing released".into());
    }
    Ok(())
}

/// Raw cycles/s for `RUN`, after a warm-up.
async fn raw_loop(ex: &mut Exec<'_>, prefix: &str, key: &str) -> TestResult<f64> {
    let (acquire, release) = fencelock_postgres::cycle_statements(prefix);
    for _ in 0..200 {
        raw_cycle(ex, &acquire, &release, key).await?;
    }
    let started = Instant::now();
    let mut done = 0usize;
    while started.elapsed() < RUN {
        raw_cycle(ex, &acquire, &release, key).await?;
        done += 1;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// Raw cycles/s on one connection, through `&mut PgConnection`
/// (`pool == None`) or a pool sized as the library's, checked out for each
/// statement as the library does, with `test_before_acquire` as given
/// (sqlx's default, which the library keeps, is `true`: a ping round trip
/// per checkout).
async fn raw_rate(connect: &PgConnectOptions, prefix: &str, pool: Option<bool>) -> TestResult<f64> {
    if let Some(test_before_acquire) = pool {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .test_before_acquire(test_before_acquire)
            .connect_with(connect.clone())
            .await?;
        let rate = raw_loop(&mut Exec::Pool(&pool), prefix, "raw-pool").await;
        pool.close().await;
        rate
    } else {
        let mut conn = connect.connect().await?;
        raw_loop(&mut Exec::Conn(&mut conn), prefix, "raw-conn").await
    }
}

/// The pgbench script: the same two statements, `$n` replaced by pgbench
/// variables (a random key per transaction; NULL kind and data as literals).
fn pgbench_script(prefix: &str) -> String {
    let (acquire, release) = fencelock_postgres::cycle_statements(prefix);
    let acquire = acquire
        .replace("$1", ":k::text")
        .replace("$2", "'pgbench'")
        .replace("$3", "NULL")
        .replace("$4", "NULL")
        .replace("$5", &TTL.as_micros().to_string());
    let release = release
        .replace("$1", ":k::text")
        .replace("$2", "'pgbench'")
        .replace("$3", ":p_token");
    format!("\\set k random(1, 1000000000)\n{acquire} \\gset p_\n{release};\n")
}

/// Transactions (= cycles) per second reported by `pgbench -c 1 -T 10`.
fn pgbench(port: u16, prefix: &str, relaxed: bool) -> TestResult<(f64, String)> {
    let bin = find_binary(
        "pgbench",
        &["/usr/lib/postgresql/*/bin"],
        "postgresql-contrib",
    )?;
    let script = std::env::temp_dir().join(format!(
        "fencelock-pgbench-{}-{prefix}.sql",
        std::process::id()
    ));
    std::fs::write(&script, pgbench_script(prefix))?;
    let mut cmd = Command::new(bin);
    cmd.args(["-n", "-M", "prepared", "-c", "1", "-T"])
        .arg(RUN.as_secs().to_string())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .arg("-f")
        .arg(&script)
        .arg("postgres");
    if relaxed {
        cmd.env("PGOPTIONS", "-c synchronous_commit=off");
    }
    let out = cmd.output();
    let _ = std::fs::remove_file(&script);
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "pgbench failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    // "tps = 1234.567890 (without initial connection time)"
    let tps = text
        .lines()
        .filter_map(|l| l.strip_prefix("tps = "))
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
        .ok_or_else(|| format!("no tps in pgbench output: {text}"))?;
    let latency = text
        .lines()
        .find(|l| l.starts_with("latency average"))
        .unwrap_or("")
        .to_owned();
    Ok((tps, latency))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> TestResult {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with(Durability::Production))
        .await??;
    let port = server.port();
    let result = async {
        for mode in ["on", "off"] {
            let relaxed = mode == "off";
            let prefix = format!("b{mode}_");
            let url = format!(
                "{}?synchronous_commit={mode}&table_prefix={prefix}",
                server.url("postgres")
            );
            let mut connect = PgConnectOptions::from_str(&server.url("postgres"))?;
            if relaxed {
                connect = connect.options([("synchronous_commit", "off")]);
            }
            println!("== synchronous_commit={mode} ==");

            // The library, 1 client, measured before and after the raw runs.
            let backend = fencelock_postgres::open_backend(&url).await?;
            let one: Vec<Arc<dyn Backend>> = vec![Arc::clone(&backend)];
            cycle_rate(&one, 1, 500, TTL).await?; // warm-up
            let lib_a = cycle_rate_for(&one, 1, RUN, TTL).await?;
            println!("fencelock, 1 client (run A):                  {lib_a:.0} cycles/s");
            drop(one);
            drop(backend);
            // Let the backend's pool and listener go away.
            tokio::time::sleep(Duration::from_millis(300)).await;

            let raw = raw_rate(&connect, &prefix, None).await?;
            println!("raw sqlx, 1 PgConnection:                     {raw:.0} cycles/s");
            let (bench, latency) = tokio::task::spawn_blocking({
                let prefix = prefix.clone();
                move || pgbench(port, &prefix, relaxed)
            })
            .await??;
            println!("pgbench -M prepared -c 1 -T {}:              {bench:.0} cycles/s ({latency})",
                RUN.as_secs());
            let pooled = raw_rate(&connect, &prefix, Some(true)).await?;
            println!("raw sqlx via PgPool, ping on checkout (sqlx default): {pooled:.0} cycles/s");
            let unpinged = raw_rate(&connect, &prefix, Some(false)).await?;
            println!("raw sqlx via PgPool, no ping on checkout:       {unpinged:.0} cycles/s");
            let listening = {
                let mut listener = PgListener::connect(&server.url("postgres")).await?;
                listener.listen(&format!("{prefix}release")).await?;
                // Drain the notifications as the library's listener does.
                let drain = tokio::spawn(async move {
                    while let Ok(Some(_)) = listener.try_recv().await {}
                });
                let rate = raw_rate(&connect, &prefix, None).await;
                drain.abort();
                rate?
            };
            println!("raw sqlx, 1 PgConnection, a LISTENer drains:  {listening:.0} cycles/s");

            let backend = fencelock_postgres::open_backend(&url).await?;
            let one: Vec<Arc<dyn Backend>> = vec![Arc::clone(&backend)];
            cycle_rate(&one, 1, 200, TTL).await?; // warm-up
            let lib_b = cycle_rate_for(&one, 1, RUN, TTL).await?;
            println!("fencelock, 1 client (run B):                  {lib_b:.0} cycles/s");
            let lib = (lib_a + lib_b) / 2.0;
            println!(
                "=> fencelock 1 client (mean {lib:.0}) = {:.0}% of raw sqlx, {:.0}% of pgbench",
                100.0 * lib / raw,
                100.0 * lib / bench
            );

            let many = cycle_rate_for(&one, 8, RUN, TTL).await?;
            println!("fencelock, 8 clients (one backend, pool of 10): {many:.0} cycles/s");

            let a = fencelock_postgres::open_backend(&url).await?;
            let b = fencelock_postgres::open_backend(&url).await?;
            let lat = handoff(a, b, HANDOFFS, TTL).await?;
            println!(
                "hand-off (release -> waiter granted, NOTIFY wake-up), {HANDOFFS} rounds: p50 {:?}, p99 {:?}",
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
