//! One torture worker: a process of its own (so that SIGSTOP is a real
//! pause), started by `fencelock torture` as the hidden `torture-worker`
//! command.
//!
//! Each round: acquire the shared key (waiting, renewed in the background),
//! admit the token at the store and read the counter, work for a while,
//! write counter + 1 carrying the token, release. The worker never calls
//! `guard.check()` before writing: the fence alone stands between a stale
//! holder and the store. With `--unfenced` the admit and the token check on
//! write are skipped.

use std::{
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use clap::Args;
use fencelock::{Error, LockClient, LockGuard, Owner};
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::history::{now_us, store_error, Event, Kind, SharedStore, Store};
use crate::Verdict;

/// The hidden `torture-worker` command's arguments (the URL comes from
/// `FENCELOCK_URL`, so that a password never shows in `ps`).
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The store file.
    #[arg(long)]
    pub store: PathBuf,
    /// This worker's number.
    #[arg(long)]
    pub worker: u32,
    /// The shared key.
    #[arg(long)]
    pub key: String,
    /// Lease length.
    #[arg(long, value_parser = crate::ttl)]
    pub ttl: Duration,
    /// Seed of this worker's work times.
    #[arg(long)]
    pub seed: u64,
    /// When to stop starting rounds, in µs on `CLOCK_MONOTONIC`.
    #[arg(long)]
    pub until_us: i64,
    /// How long a store statement may wait for another process's
    /// transaction.
    #[arg(long, value_parser = fencelock::parse_duration)]
    pub busy: Duration,
    /// The parent's pid: the worker exits with it.
    #[arg(long)]
    pub parent: i32,
    /// Skip the fence.
    #[arg(long)]
    pub unfenced: bool,
}

/// How long a round works between its read and its write: mostly a short
/// while, one round in five longer than the TTL (the lease is renewed
/// meanwhile). The long rounds are the ones a partition or a lost lease
/// can overtake: only a holder still working when its lease ends can be
/// stale at its write.
fn work_time(rng: &mut StdRng, ttl: Duration) -> Duration {
    if rng.gen_bool(0.2) {
        ttl.mul_f64(rng.gen_range(1.0..2.0))
    } else {
        ttl.mul_f64(rng.gen_range(0.02..0.2))
    }
}

/// Runs the worker until `until_us`; [`Verdict::Passed`], or an error that
/// stops it (the parent then fails the run: the history would be
/// incomplete).
pub async fn run(url: &str, args: WorkerArgs) -> Result<Verdict, Error> {
    exit_with_parent(args.parent)?;
    let store = SharedStore::new(Store::open(&args.store, args.busy, !args.unfenced)?);
    let worker = args.worker;
    let client = loop {
        match connect(url, &args).await {
            Ok(client) => break client,
            Err(e) if e.is_transient() && now_us() < args.until_us => {
                store
                    .record(vec![error_event(worker, "connect", &e)])
                    .await?;
                tokio::time::sleep(args.ttl / 4).await;
            }
            Err(e) => return Err(e),
        }
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    while now_us() < args.until_us {
        let requested = now_us();
        let wait = Duration::from_micros((args.until_us - requested).unsigned_abs());
        let acquired = client
            .lock(args.key.as_str())
            .ttl(args.ttl)
            .wait(wait)
            .acquire()
            .await;
        match acquired {
            Ok(guard) => round(&store, worker, guard, requested, &mut rng, args.ttl).await?,
            Err(Error::Timeout { .. }) => {}
            Err(e) => {
                // The backend is down or cut off: what the nemesis does.
                store
                    .record(vec![error_event(worker, "acquire", &e)])
                    .await?;
                if !e.is_transient() && !matches!(e, Error::Backend(_)) {
                    return Err(e);
                }
                tokio::time::sleep(args.ttl / 10).await;
            }
        }
    }
    Ok(Verdict::Passed)
}

async fn connect(url: &str, args: &WorkerArgs) -> Result<LockClient, Error> {
    let backend = fencelock::open_backend(url).await?;
    // A partitioned call gives up after a TTL instead of the default 10 s,
    // so that a cut-off worker keeps cycling through its rounds.
    LockClient::builder(backend)
        .owner(Owner::new(format!(
            "torture-w{}-{}",
            args.worker,
            std::process::id()
        ))?)
        .ttl(args.ttl)
        .op_timeout(args.ttl.max(Duration::from_secs(1)))
        .build()
}

fn error_event(worker: u32, during: &str, e: &Error) -> Event {
    Event::new(Kind::Error, Some(worker), None, now_us()).detail(format!("{during}: {e}"))
}

async fn round(
    store: &SharedStore,
    worker: u32,
    guard: LockGuard,
    requested: i64,
    rng: &mut StdRng,
    ttl: Duration,
) -> Result<(), Error> {
    let granted = now_us();
    let token = guard.token();
    let noticed = Arc::new(OnceLock::new());
    let watcher = {
        let lost = guard.lost();
        let noticed = Arc::clone(&noticed);
        tokio::spawn(async move {
            let reason = lost.await;
            let _ = noticed.set((now_us(), reason));
        })
    };
    let grant = Event::new(Kind::Grant, Some(worker), Some(token), granted).started(requested);
    if let Some(read) = store.call(move |s| s.begin(grant)).await? {
        tokio::time::sleep(work_time(rng, ttl)).await;
        store.call(move |s| s.write(worker, token, read)).await?;
    }
    let release_called = now_us();
    let released = guard.release().await;
    let release_answered = now_us();
    watcher.abort();
    let outcome = match &released {
        Ok(()) => "ok",
        Err(Error::NotHeld { .. }) => "not-held",
        Err(_) => "error",
    };
    let mut release = Event::new(Kind::Release, Some(worker), Some(token), release_answered)
        .started(release_called)
        .outcome(outcome);
    if let Err(e) = &released {
        release = release.detail(e.to_string());
    }
    let mut events = Vec::with_capacity(2);
    if let Some((t, reason)) = noticed.get() {
        events.push(Event::new(Kind::Lost, Some(worker), Some(token), *t).detail(reason.as_str()));
    }
    events.push(release);
    store.record(events).await
}

/// Makes the kernel kill this worker when the parent dies, whatever way it
/// dies, so that no worker outlives a run.
fn exit_with_parent(parent: i32) -> Result<(), Error> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| store_error(format!("cannot set the parent-death signal: {e}")))?;
    }
    // The parent may have died before the line above.
    if nix::unistd::getppid().as_raw() != parent {
        return Err(Error::InvalidArgument(
            "the torture parent is gone; not starting".into(),
        ));
    }
    Ok(())
}
