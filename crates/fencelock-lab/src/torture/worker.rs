//! One torture worker: a process of its own (so that SIGSTOP is a real
//! pause), started by `fencelock torture` as the hidden `torture-worker`
//! command.
//!
//! Each round: acquire what the workload takes (the lock, a permit, a
//! reader's or writer's lease, leadership, or 2–3 keys; waiting, renewed in
//! the background), admit each token at the store and read its counter, work
//! for a while, write each counter + 1 carrying its token (a reader writes
//! nothing but the record of its admitted write), release. The worker never
//! calls `check()` before writing: the fence alone stands between a stale
//! holder and the store. With `--unfenced` the admits and the token checks
//! on write are skipped.

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, OnceLock},
    time::Duration,
};

use clap::Args;
use fencelock::{
    sharded::ShardMap, Error, GuardHandle, Leadership, LockClient, LockGuard, LockMode, LossReason,
    MultiGuard, Owner, Permit,
};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

use super::{
    history::{now_us, store_error, Event, Kind, Part, SharedStore, Store, RESOURCE},
    workload::{multi_key, slot_resource, Workload, MULTI_KEYS},
};
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
    /// What to take.
    #[arg(long, value_enum, default_value_t)]
    pub workload: Workload,
    /// The semaphore's permits.
    #[arg(long, default_value_t = 3)]
    pub permits: u32,
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

/// Makes a worker's new step of a shard map known to every store before
/// the worker says it has moved (the backend's first operation checks and
/// records its epoch on all of them): the nemesis takes the next step once
/// every worker has moved, and a store that never saw this step would
/// refuse processes on the next one as two steps apart.
async fn record_step(client: &LockClient, key: &str) -> Result<(), Error> {
    client
        .backend()
        .inspect(&fencelock::LockKey::new(key)?)
        .await
        .map(|_| ())
}

/// Runs the worker until `until_us`; [`Verdict::Passed`], or an error that
/// stops it (the parent then fails the run: the history would be
/// incomplete).
pub async fn run(url: &str, args: WorkerArgs) -> Result<Verdict, Error> {
    exit_with_parent(args.parent)?;
    let store = SharedStore::new(Store::open(&args.store, args.busy, !args.unfenced)?);
    let worker = args.worker;
    let map = shard_map(url);
    let mut epoch = map.as_deref().map(map_epoch).transpose()?;
    let mut client = connect_retrying(url, &args, &store).await?;
    if let Some(epoch) = epoch {
        record_step(&client, &args.key).await?;
        store.record(vec![map_event(worker, epoch)]).await?;
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    while now_us() < args.until_us {
        if let Some(path) = map.as_deref() {
            // Between rounds nothing is held: the one moment a worker may
            // move to the next step of a transition.
            let now = map_epoch(path)?;
            if epoch != Some(now) {
                client = connect_retrying(url, &args, &store).await?;
                epoch = Some(now);
                record_step(&client, &args.key).await?;
                store.record(vec![map_event(worker, now)]).await?;
            }
        }
        let requested = now_us();
        let mut wait = Duration::from_micros((args.until_us - requested).unsigned_abs());
        if map.is_some() {
            // A waiter must not stay on a step the others have left: it
            // gives up after a lease and looks at the map again.
            wait = wait.min(args.ttl);
        }
        match acquire(&client, &args, wait, &mut rng).await {
            Ok(held) => {
                round(
                    &store, &args.key, worker, held, requested, &mut rng, args.ttl,
                )
                .await?
            }
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

/// Opens the client, retrying while the backend is down and the run goes
/// on.
async fn connect_retrying(
    url: &str,
    args: &WorkerArgs,
    store: &SharedStore,
) -> Result<LockClient, Error> {
    loop {
        match connect(url, args).await {
            Ok(client) => return Ok(client),
            Err(e) if e.is_transient() && now_us() < args.until_us => {
                store
                    .record(vec![error_event(args.worker, "connect", &e)])
                    .await?;
                tokio::time::sleep(args.ttl / 4).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The map file of a `sharded://` URL.
fn shard_map(url: &str) -> Option<PathBuf> {
    let (scheme, path) = url.split_once("://")?;
    scheme
        .eq_ignore_ascii_case("sharded")
        .then(|| PathBuf::from(path))
}

/// The epoch of the map in `path` now.
fn map_epoch(path: &std::path::Path) -> Result<u64, Error> {
    Ok(ShardMap::read(path)?.epoch)
}

fn map_event(worker: u32, epoch: u64) -> Event {
    Event::new(Kind::Map, Some(worker), None, now_us()).detail(epoch.to_string())
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

/// What a worker holds in a round.
enum Held {
    /// The lock, or a read-write lock's side (the guard's mode says which).
    Guard(LockGuard),
    Permit(Permit),
    Leader(Leadership),
    Keys(MultiGuard),
}

/// Takes what the workload takes: the multi-key workload 2–3 of its keys in
/// a random order (the client sorts them), the rwlock workload a reader's
/// lease every other round on average (readers then meet each other often
/// and writers still get through in a short run).
async fn acquire(
    client: &LockClient,
    args: &WorkerArgs,
    wait: Duration,
    rng: &mut StdRng,
) -> Result<Held, Error> {
    let key = args.key.as_str();
    Ok(match args.workload {
        Workload::Lock => Held::Guard(client.lock(key).ttl(args.ttl).wait(wait).acquire().await?),
        Workload::Rwlock => {
            let rw = client.rwlock(key);
            let side = if rng.gen_bool(0.5) {
                rw.read()
            } else {
                rw.write()
            };
            Held::Guard(side.ttl(args.ttl).wait(wait).acquire().await?)
        }
        Workload::Semaphore => Held::Permit(
            client
                .semaphore(key, args.permits)
                .ttl(args.ttl)
                .wait(wait)
                .acquire()
                .await?,
        ),
        Workload::Election => Held::Leader(
            client
                .election(key)
                .ttl(args.ttl)
                .campaign_for(wait)
                .await?,
        ),
        Workload::Multi => {
            let mut keys: Vec<String> = (0..MULTI_KEYS).map(|i| multi_key(key, i)).collect();
            keys.shuffle(rng);
            keys.truncate(rng.gen_range(2..=3));
            Held::Keys(
                client
                    .lock_all(keys)
                    .ttl(args.ttl)
                    .wait(wait)
                    .acquire()
                    .await?,
            )
        }
    })
}

/// A grant's loss signal: the resource lost, and why.
type Lost = Pin<Box<dyn Future<Output = (Option<String>, LossReason)> + Send>>;

fn whole(
    resource: Option<String>,
    lost: impl Future<Output = LossReason> + Send + 'static,
) -> Lost {
    Box::pin(async move { (resource, lost.await) })
}

impl Held {
    /// The fenced resources this grant covers, with their tokens.
    fn parts(&self, key: &str) -> Vec<Part> {
        match self {
            Held::Guard(g) => vec![Part {
                resource: RESOURCE.to_owned(),
                token: g.token(),
                shared: g.mode() == LockMode::Shared,
            }],
            Held::Permit(p) => vec![Part::exclusive(slot_resource(key, p.slot()), p.token())],
            Held::Leader(l) => vec![Part::exclusive(RESOURCE, l.term())],
            // Each key is its own resource, fenced with its own token.
            Held::Keys(m) => m
                .tokens()
                .into_iter()
                .map(|(k, t)| Part::exclusive(k.as_str(), t))
                .collect(),
        }
    }

    /// The guard of each part, in the order of [`parts`](Self::parts).
    fn handles(&self) -> Vec<GuardHandle> {
        match self {
            Held::Guard(g) => vec![g.handle()],
            Held::Permit(p) => vec![p.handle()],
            Held::Leader(l) => vec![l.handle()],
            Held::Keys(m) => m.guards().iter().map(|g| g.handle()).collect(),
        }
    }

    /// Resolves when the grant is lost: which part (by resource), and why.
    fn lost(&self, parts: &[Part]) -> Lost {
        let only = parts.first().map(|p| p.resource.clone());
        match self {
            Held::Guard(g) => whole(only, g.lost()),
            Held::Permit(p) => whole(only, p.lost()),
            Held::Leader(l) => whole(only, l.lost()),
            Held::Keys(m) => {
                let lost = m.lost();
                Box::pin(async move {
                    let (key, reason) = lost.await;
                    (Some(key.as_str().to_owned()), reason)
                })
            }
        }
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Permit(p) => p.release().await,
            Held::Leader(l) => l.resign().await,
            Held::Keys(m) => m.release().await,
        }
    }
}

async fn round(
    store: &SharedStore,
    key: &str,
    worker: u32,
    held: Held,
    requested: i64,
    rng: &mut StdRng,
    ttl: Duration,
) -> Result<(), Error> {
    let granted = now_us();
    let parts = held.parts(key);
    let handles = held.handles();
    let noticed = Arc::new(OnceLock::new());
    let watcher = {
        let lost = held.lost(&parts);
        let noticed = Arc::clone(&noticed);
        tokio::spawn(async move {
            let (resource, reason) = lost.await;
            let _ = noticed.set((now_us(), resource, reason));
        })
    };
    let begun = parts.clone();
    let reads = store
        .call(move |s| s.begin(worker, requested, granted, &begun))
        .await?;
    let admitted: Vec<(Part, i64)> = parts
        .iter()
        .zip(reads)
        .filter_map(|(p, read)| Some((p.clone(), read?)))
        .collect();
    if !admitted.is_empty() {
        tokio::time::sleep(work_time(rng, ttl)).await;
        store.call(move |s| s.write(worker, &admitted)).await?;
    }
    let release_called = now_us();
    let released = held.release().await;
    let release_answered = now_us();
    watcher.abort();
    let outcome = match &released {
        Ok(()) => "ok",
        Err(Error::NotHeld { .. }) => "not-held",
        Err(_) => "error",
    };
    let mut events = Vec::with_capacity(2 * parts.len() + 1);
    if let Some((t, resource, reason)) = noticed.get() {
        // The part that was lost, with its token.
        if let Some(part) = parts
            .iter()
            .find(|p| Some(&p.resource) == resource.as_ref())
        {
            events.push(part.event(Kind::Lost, worker, *t).detail(reason.as_str()));
        }
    }
    // Each part's trust ends at the first of release called, its loss
    // noticed and its guard's deadline, which a paused holder passed while
    // stopped and noticed only after.
    for (part, handle) in parts.iter().zip(&handles) {
        let lost = noticed
            .get()
            .filter(|(_, resource, _)| resource.as_ref() == Some(&part.resource))
            .map(|(t, _, _)| *t);
        let end = lost
            .into_iter()
            .chain([release_called, monotonic_us(handle.trusted_until())])
            .min()
            .unwrap_or(release_called);
        events.push(part.event(Kind::Trusted, worker, end));
    }
    // One release ends the belief in every part.
    for part in &parts {
        let mut release = part
            .event(Kind::Release, worker, release_answered)
            .started(release_called)
            .outcome(outcome);
        if let Err(e) = &released {
            release = release.detail(e.to_string());
        }
        events.push(release);
    }
    store.record(events).await
}

/// `at` in µs on `CLOCK_MONOTONIC`, the history's clock (tokio's instants
/// are on it too).
fn monotonic_us(at: tokio::time::Instant) -> i64 {
    let (now, now_at) = (now_us(), tokio::time::Instant::now());
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    if at >= now_at {
        now.saturating_add(micros(at - now_at))
    } else {
        now - micros(now_at - at)
    }
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
