//! Event latency and the service's CPU while many locks are held (and
//! renewed) and `/v1/events` is followed: the backend listed every
//! `--events-interval` (before) against its change notices (after), in
//! turns within one run (`docs/benchmarks.md`).
//!
//! ```text
//! cargo run --release -p fencelock-serve --example events_latency -- \
//!     redis://127.0.0.1:PORT [--locks 100000] [--probes 100] [--rounds 3] [--ttl 60s] \
//!     [--sources listing,notices]
//! ```
//!
//! The locks are held by a client of the backend itself (renewed every
//! third of `--ttl` in batches), not through the service, so the service's
//! CPU is its event machinery alone: it runs in this process on a runtime
//! of its own (one worker, threads named `fl-svc`), whose threads' CPU time
//! is read from `/proc/self/task`. A probe then takes and releases a key of
//! its own directly on the backend; latency is from just before that call
//! to the event's arrival at a follower of the stream.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring tool: a failure ends it

use std::{sync::Arc, time::Duration};

use eventsource_stream::Eventsource;
use fencelock_core::{
    Acquire, AcquireAll, AcquireRequest, Backend, LeaseId, LockClient, LockKey, Owner, Renewal,
};
use fencelock_serve::{Server, Service};
use futures_util::StreamExt;
use tokio::{sync::mpsc, time::Instant};

const PROBE: &str = "events-latency/probe";
/// Keys taken, and renewed, per call.
const BATCH: usize = 1000;
/// The service's threads, by name (`/proc/self/task/*/comm`).
const SERVICE_THREADS: &str = "fl-svc";

struct Args {
    url: String,
    locks: usize,
    probes: usize,
    rounds: usize,
    ttl: Duration,
    /// Which sides run: with 100,000 locks a listing takes longer than a
    /// probe waits, so a large run may measure the notices alone.
    listing: bool,
    notices: bool,
}

fn args() -> Args {
    let mut args = Args {
        url: String::new(),
        locks: 100_000,
        probes: 100,
        rounds: 3,
        ttl: Duration::from_secs(60),
        listing: true,
        notices: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().expect("a value after the option");
        match arg.as_str() {
            "--locks" => args.locks = value().parse().expect("--locks N"),
            "--probes" => args.probes = value().parse().expect("--probes N"),
            "--rounds" => args.rounds = value().parse().expect("--rounds N"),
            "--ttl" => args.ttl = humantime::parse_duration(&value()).expect("--ttl 60s"),
            "--sources" => {
                let sources = value();
                args.listing = sources.split(',').any(|s| s == "listing");
                args.notices = sources.split(',').any(|s| s == "notices");
                assert!(
                    args.listing || args.notices,
                    "--sources listing,notices (either or both)"
                );
            }
            url if !url.starts_with("--") => args.url = url.to_owned(),
            other => panic!("unknown option {other}"),
        }
    }
    assert!(!args.url.is_empty(), "usage: events_latency URL [options]");
    args
}

async fn connect(url: &str) -> Arc<dyn Backend> {
    if url.starts_with("redis://") {
        Arc::new(fencelock_redis::RedisBackend::connect(url).await.unwrap())
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Arc::new(
            fencelock_postgres::PostgresBackend::connect(url)
                .await
                .unwrap(),
        )
    } else {
        panic!("redis:// or postgres:// URLs only")
    }
}

/// Takes `n` keys for `owner`, a batch at a time.
async fn hold(backend: &dyn Backend, owner: &Owner, n: usize, ttl: Duration) -> Vec<LeaseId> {
    let mut leases = Vec::with_capacity(n);
    let keys: Vec<LockKey> = (0..n)
        .map(|i| LockKey::new(format!("events-latency/held/{i:07}")).unwrap())
        .collect();
    for chunk in keys.chunks(BATCH) {
        let requests: Vec<AcquireRequest> = chunk
            .iter()
            .map(|k| AcquireRequest::new(k.clone(), owner.clone(), ttl))
            .collect();
        match backend.try_acquire_all(&requests).await {
            Ok(AcquireAll::Granted(grants)) => {
                for (r, g) in requests.iter().zip(grants) {
                    leases.push(r.lease(g.token));
                }
            }
            Ok(AcquireAll::Held { index, .. }) => panic!("{} is held", requests[index].key),
            Err(_) => {
                for r in &requests {
                    match backend.try_acquire(r).await.unwrap() {
                        Acquire::Granted(g) => leases.push(r.lease(g.token)),
                        Acquire::Held(_) => panic!("{} is held", r.key),
                    }
                }
            }
        }
    }
    leases
}

/// CPU time of this process's threads named [`SERVICE_THREADS`].
fn service_cpu() -> Duration {
    let ticks_per_s = 100; // USER_HZ on Linux
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(SERVICE_THREADS) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3; utime and
        // stime are fields 14 and 15.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    }
    Duration::from_millis(ticks * 1000 / ticks_per_s)
}

struct Figures {
    p50: Duration,
    p99: Duration,
    max: Duration,
    cpu: f64,
    missed: usize,
}

/// One measurement: a fresh service (listing only, or with notices),
/// followed, probed `probes` times.
async fn measure(args: &Args, notices: bool, direct: &dyn Backend) -> Figures {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(SERVICE_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let url = args.url.clone();
    let (addr, handle) = runtime
        .spawn(async move {
            let backend = connect(&url).await;
            let service = Service::builder(LockClient::new(backend))
                .events_notices(notices)
                .build();
            let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
                .await
                .unwrap();
            (server.local_addr(), server.spawn())
        })
        .await
        .unwrap();
    let response = reqwest::get(format!("http://{addr}/v1/events?key={PROBE}"))
        .await
        .unwrap();
    assert!(response.status().is_success());
    let (tx, mut arrivals) = mpsc::unbounded_channel();
    let follower = tokio::spawn(async move {
        let mut events = response.bytes_stream().eventsource();
        while let Some(Ok(event)) = events.next().await {
            let body: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
            if tx
                .send((event.event, body["token"].as_u64(), Instant::now()))
                .is_err()
            {
                return;
            }
        }
    });
    // The seeding listing is done (the head came after it); let the first
    // rounds of reads settle before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while arrivals.try_recv().is_ok() {}

    let key = LockKey::new(PROBE).unwrap();
    let owner = Owner::new("probe").unwrap();
    let mut latencies = Vec::with_capacity(2 * args.probes);
    let mut missed = 0;
    let cpu_before = service_cpu();
    let started = Instant::now();
    for i in 0..args.probes {
        // Probes out of step with any listing period.
        let pause = 50 + (i * 7919) % 200;
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        let request = AcquireRequest::new(key.clone(), owner.clone(), args.ttl);
        let sent = Instant::now();
        let Acquire::Granted(grant) = direct.try_acquire(&request).await.unwrap() else {
            panic!("the probe key is held");
        };
        let token = grant.token.get();
        for kind in ["acquired", "released"] {
            let sent = if kind == "released" {
                let sent = Instant::now();
                direct.release(&request.lease(grant.token)).await.unwrap();
                sent
            } else {
                sent
            };
            let arrived = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let (k, t, at) = arrivals.recv().await.expect("the stream ended");
                    if k == kind && t == Some(token) {
                        return at;
                    }
                }
            })
            .await;
            match arrived {
                Ok(at) => latencies.push(at - sent),
                Err(_) => missed += 1,
            }
        }
    }
    let wall = started.elapsed();
    let cpu = (service_cpu() - cpu_before).as_secs_f64() / wall.as_secs_f64();
    follower.abort();
    drop(handle);
    runtime.shutdown_background();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Figures {
        p50: at(0.50),
        p99: at(0.99),
        max: at(1.0),
        cpu,
        missed,
    }
}

#[tokio::main]
async fn main() {
    let args = args();
    let direct = connect(&args.url).await;
    let holder = Owner::new("holder").unwrap();
    let began = Instant::now();
    let leases = hold(direct.as_ref(), &holder, args.locks, args.ttl).await;
    eprintln!(
        "holding {} locks (taken in {:?})",
        leases.len(),
        began.elapsed()
    );
    let renewer = {
        let direct = Arc::clone(&direct);
        let ttl = args.ttl;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                for chunk in leases.chunks(BATCH) {
                    let batch: Vec<Renewal> =
                        chunk.iter().map(|l| Renewal::new(l.clone(), ttl)).collect();
                    direct.renew_many(&batch).await.unwrap();
                }
            }
        })
    };
    println!("round\tsource\tp50_ms\tp99_ms\tmax_ms\tservice_cpu_%\tmissed");
    for round in 1..=args.rounds {
        // Turns alternate which side goes first, so drift weighs on both.
        let order = if round % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for notices in order {
            if !(if notices { args.notices } else { args.listing }) {
                continue;
            }
            let f = measure(&args, notices, direct.as_ref()).await;
            println!(
                "{round}\t{}\t{:.2}\t{:.2}\t{:.2}\t{:.1}\t{}",
                if notices { "notices" } else { "listing" },
                f.p50.as_secs_f64() * 1e3,
                f.p99.as_secs_f64() * 1e3,
                f.max.as_secs_f64() * 1e3,
                f.cpu * 100.0,
                f.missed,
            );
        }
    }
    renewer.abort();
    let released = direct
        .administer()
        .unwrap()
        .release_all(&holder)
        .await
        .unwrap();
    eprintln!("released {released} locks");
}
