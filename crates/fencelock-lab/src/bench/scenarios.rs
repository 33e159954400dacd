//! The scenarios but `failover` (in its own module). Each returns a
//! [`Report`].

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fencelock::{redact_url, Backend, Error, LockClient, LockGuard, Result};
use fencelock_testkit::proxy::{endpoints, with_endpoints, FaultProxy};
use tokio::time::{sleep_until, Instant};

use super::{
    driver::{drive, Figures, Keys, LibraryCycle, Op, PermitCycle, RawCycleOp, Tally},
    process,
    recorder::{self, Count},
    report::{Baseline, Dead, Hold, Renewals, Report},
    stats::Latencies,
    DeadMode, Scenario, Setup,
};

/// How long a hand-off waiter may wait before the round counts as failed.
const HANDOFF_WAIT: Duration = Duration::from_secs(30);
/// How long a holder keeps the lock after another client started trying,
/// so that what is measured is the waiter's wake-up, not a lucky retry
/// that lands just after the release: on loopback, longer than a try. (In
/// a lab, the site's round trips are added: `Setup::handoff_hold`.)
pub(super) const HANDOFF_HOLD: Duration = Duration::from_millis(5);

pub async fn run(setup: &Setup) -> Result<Report> {
    match setup.scenario {
        Scenario::Cycle | Scenario::Contended => cycle(setup).await,
        Scenario::Handoff => handoff(setup).await,
        Scenario::Renew | Scenario::Hold => hold(setup).await,
        Scenario::Semaphore => semaphore(setup).await,
        Scenario::Failover => super::failover::run(setup).await,
    }
}

pub(super) fn report(
    setup: &Setup,
    backend: &'static str,
    op: &'static str,
    figures: Figures,
) -> Report {
    Report {
        scenario: setup.scenario.name(),
        backend,
        url: redact_url(&setup.url),
        clients: setup.clients,
        keys: setup.keys,
        duration_s: setup.duration.as_secs_f64(),
        ttl_s: setup.ttl.as_secs_f64(),
        op,
        fencelock: figures,
        baseline: None,
        renewals: None,
        hold: None,
        permits: None,
        failover: None,
        dead: None,
    }
}

/// The keys of client `c`: its own in `cycle`, one shared in `contended`.
fn keys_of(setup: &Setup, c: usize) -> Keys {
    Keys::new(match setup.scenario {
        Scenario::Contended => vec![format!("{}:contended", setup.run)],
        _ => (0..setup.keys)
            .map(|k| format!("{}:c{c}:k{k}", setup.run))
            .collect(),
    })
}

/// The library's clients: one backend (its pool or multiplexed connection
/// shared, as in an application), one `LockClient` (owner) per client.
fn clients(backend: &Arc<dyn Backend>, n: usize) -> Result<Vec<LockClient>> {
    (0..n)
        .map(|_| LockClient::builder(Arc::clone(backend)).build())
        .collect()
}

/// The engine's limit for the same cycles: one raw worker per client.
async fn raw_cycles(setup: &Setup, duration: Duration) -> Result<(String, Tally)> {
    let raw = fencelock::open_baseline(&setup.url).await?;
    let mut ops: Vec<Box<dyn Op>> = Vec::with_capacity(setup.clients);
    for c in 0..setup.clients {
        ops.push(Box::new(RawCycleOp {
            raw: raw.worker().await?,
            keys: keys_of(setup, c),
            ttl: setup.ttl,
        }));
    }
    Ok((raw.describe(), drive(ops, setup.warmup, duration).await))
}

/// Runs the library's clients, each repeating the op `op_of` makes for it,
/// and with `--baseline` the raw cycles, alternating in `rounds` slices of
/// the duration so that load drifting on a shared machine weighs on both
/// alike. `raw_note` is added to the raw side's description.
async fn library_beside_raw<F>(
    setup: &Setup,
    op: &'static str,
    raw_note: &str,
    op_of: F,
) -> Result<Report>
where
    F: Fn(usize, LockClient) -> Box<dyn Op>,
{
    let rounds = if setup.baseline || setup.dead_nodes > 0 {
        setup.rounds
    } else {
        1
    };
    let slice = setup.duration / rounds;
    let (mut library, mut raw, mut dead) = (Tally::default(), Tally::default(), Tally::default());
    let (mut name, mut describe) = ("", String::new());
    for _ in 0..rounds {
        let backend = fencelock::open_backend(&setup.url).await?;
        name = backend.name();
        let ops = clients(&backend, setup.clients)?
            .into_iter()
            .enumerate()
            .map(|(c, client)| op_of(c, client))
            .collect();
        // The library's connections (e.g. a wake-up subscriber that every
        // raw release would notify) must not weigh on the raw run: the
        // clients go with their tasks, the backend here.
        drop(backend);
        library.add(drive(ops, setup.warmup, slice).await);
        if setup.baseline {
            let (what, tally) = raw_cycles(setup, slice).await?;
            describe = format!("{what}{raw_note}");
            raw.add(tally);
        }
        if setup.dead_nodes > 0 {
            // Connected while alive, as an application is when a node dies;
            // the warm-up then takes the first operations after the death.
            let (url, proxies) = behind_proxies(setup).await?;
            let backend = fencelock::open_backend(&url).await?;
            let ops = clients(&backend, setup.clients)?
                .into_iter()
                .enumerate()
                .map(|(c, client)| op_of(c, client))
                .collect();
            drop(backend);
            for proxy in &proxies {
                let node = proxy.controls();
                match setup.dead_mode {
                    DeadMode::Killed => {
                        node.set_refuse(true);
                        node.reset_all();
                    }
                    DeadMode::Silent => node.partition(),
                }
            }
            dead.add(drive(ops, setup.warmup, slice).await);
        }
    }
    let mut report = report(setup, name, op, library.figures());
    if setup.baseline {
        report.baseline = Some(Baseline::new(describe, &report.fencelock, raw.figures()));
    }
    if setup.dead_nodes > 0 {
        let mode = match setup.dead_mode {
            DeadMode::Killed => "killed",
            DeadMode::Silent => "silent",
        };
        report.dead = Some(Dead::new(
            setup.dead_nodes,
            mode,
            &report.fencelock,
            dead.figures(),
        ));
    }
    Ok(report)
}

/// The run's URL with its last `--dead-nodes` endpoints reached through
/// fault proxies, and those proxies.
async fn behind_proxies(setup: &Setup) -> Result<(String, Vec<FaultProxy>)> {
    let failed = |e: &dyn std::fmt::Display| Error::InvalidArgument(format!("--dead-nodes: {e}"));
    let mut nodes = endpoints(&setup.url).map_err(|e| failed(&e))?;
    let first = nodes.len().saturating_sub(setup.dead_nodes);
    let mut proxies = Vec::with_capacity(setup.dead_nodes);
    for node in &mut nodes[first..] {
        let proxy = FaultProxy::start(*node).await.map_err(|e| failed(&e))?;
        *node = proxy.addr();
        proxies.push(proxy);
    }
    let url = with_endpoints(&setup.url, &nodes).map_err(|e| failed(&e))?;
    Ok((url, proxies))
}

/// `cycle` and `contended`.
async fn cycle(setup: &Setup) -> Result<Report> {
    let op = match setup.scenario {
        Scenario::Contended => "try_lock of the shared key, then release if granted",
        _ => "acquire (no wait) + release of the client's next key",
    };
    library_beside_raw(setup, op, "", |c, client| {
        Box::new(LibraryCycle {
            client,
            keys: keys_of(setup, c),
            ttl: setup.ttl,
        })
    })
    .await
}

/// `semaphore`: each client takes one permit of one semaphore without
/// waiting and gives it back. The raw baseline is the raw cycle of one key
/// per client: a permit is one lease, so one acquire and one release is the
/// least it can cost.
async fn semaphore(setup: &Setup) -> Result<Report> {
    let name = format!("{}:semaphore", setup.run);
    let mut report = library_beside_raw(
        setup,
        "acquire (no wait) + release of one permit of the semaphore",
        " (a permit is one lease)",
        |_, client| {
            Box::new(PermitCycle {
                client,
                name: name.clone(),
                permits: setup.permits,
                ttl: setup.ttl,
            })
        },
    )
    .await?;
    report.permits = Some(setup.permits);
    Ok(report)
}

/// What the hand-off clients share.
struct Relay {
    /// When the holder called release, taken by the next holder.
    released_at: Mutex<Option<Instant>>,
    /// Grants so far, so a releaser can stay out until someone else got it.
    grants: Arc<Count>,
    /// Acquisitions begun and ended (granted or failed): while more began
    /// than ended, some client other than the holder is waiting. Counted
    /// around the whole acquisition, not per attempt, because a wait through
    /// a lock service is one long poll (`Capabilities::waits`), not a
    /// series of tries.
    began: Arc<Count>,
    ended: Arc<Count>,
}

impl Relay {
    /// Completes once a client is inside an acquisition.
    async fn someone_waits(&self) {
        loop {
            let began = self.began.get();
            if began > self.ended.get() {
                return;
            }
            self.began.above(began).await;
        }
    }
}

#[derive(Default)]
struct HandoffTally {
    handoffs: u64,
    errors: u64,
    latencies: Latencies,
    first_error: Option<String>,
}

async fn handoff(setup: &Setup) -> Result<Report> {
    let key = format!("{}:handoff", setup.run);
    let relay = Arc::new(Relay {
        released_at: Mutex::new(None),
        grants: Arc::new(Count::default()),
        began: Arc::new(Count::default()),
        ended: Arc::new(Count::default()),
    });
    let mut first: Option<Arc<dyn Backend>> = None;
    let mut backends = Vec::with_capacity(setup.clients);
    for _ in 0..setup.clients {
        // A backend (connections, wake-up subscription) per client, so the
        // release reaches the waiter through the engine, as between
        // processes; an in-process backend (memory) is one store, shared.
        let backend = match &first {
            Some(shared) if !shared.capabilities().persistent => Arc::clone(shared),
            _ => fencelock::open_backend(&setup.url).await?,
        };
        first.get_or_insert_with(|| Arc::clone(&backend));
        backends.push(backend);
    }
    // From once every client is open: across data centres opening takes
    // round trips of its own (a ZooKeeper session and its directories,
    // seconds at 150 ms one way), which left a short window no hand-off.
    let start = Instant::now() + setup.warmup;
    let end = start + setup.duration;
    let mut tasks = Vec::with_capacity(setup.clients);
    for backend in backends {
        let client = LockClient::builder(backend).build()?;
        let (key, relay, ttl, hold) = (
            key.clone(),
            Arc::clone(&relay),
            setup.ttl,
            setup.handoff_hold,
        );
        tasks.push(tokio::spawn(async move {
            let mut tally = HandoffTally::default();
            while Instant::now() < end {
                let waiting_since = Instant::now();
                relay.began.increment_by_one();
                let acquired = client
                    .lock(key.as_str())
                    .ttl(ttl)
                    .wait(HANDOFF_WAIT)
                    .acquire()
                    .await;
                relay.ended.increment_by_one();
                let guard = match acquired {
                    Ok(guard) => guard,
                    Err(e) => {
                        tally.errors += 1;
                        let stop = !e.is_transient();
                        tally.first_error.get_or_insert_with(|| e.to_string());
                        if stop {
                            break;
                        }
                        continue;
                    }
                };
                let granted = Instant::now();
                relay.grants.increment_by_one();
                let released = relay
                    .released_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(released) = released {
                    if released >= waiting_since && released >= start && granted < end {
                        tally.handoffs += 1;
                        tally.latencies.record(granted - released);
                    }
                }
                pass_on(guard, &relay, hold, end, &mut tally).await;
            }
            tally
        }));
    }
    let mut total = HandoffTally::default();
    for task in tasks {
        let t = task
            .await
            .map_err(|e| Error::InvalidArgument(format!("client task: {e}")))?;
        total.handoffs += t.handoffs;
        total.errors += t.errors;
        total.latencies.merge(&t.latencies);
        total.first_error = total.first_error.or(t.first_error);
    }
    let figures = Figures::new(
        total.handoffs,
        total.handoffs,
        total.errors,
        setup.duration,
        &total.latencies,
        total.first_error,
    );
    let backend = first.ok_or_else(|| Error::InvalidArgument("no clients".into()))?;
    let name = backend.name();
    drop(backend);
    let mut report = report(
        setup,
        name,
        "hand-off: the holder's release call to the waiting client's grant",
        figures,
    );
    if setup.baseline {
        // The least a hand-off can take is the release's round trip
        // followed by the next acquire's: one raw cycle.
        let one_client = Setup {
            scenario: Scenario::Cycle,
            clients: 1,
            keys: 1,
            ..setup.clone()
        };
        let (raw, tally) = raw_cycles(&one_client, setup.duration).await?;
        report.baseline = Some(Baseline::new(
            format!("{raw}, 1 client (a hand-off cannot beat one release + one acquire)"),
            &report.fencelock,
            tally.figures(),
        ));
    }
    Ok(report)
}

/// Holds the lock until another client is waiting for it (plus `hold`),
/// releases it, and stays out until someone else got it.
async fn pass_on(
    guard: LockGuard,
    relay: &Relay,
    hold: Duration,
    end: Instant,
    tally: &mut HandoffTally,
) {
    if Instant::now() < end {
        tokio::select! {
            () = relay.someone_waits() => tokio::time::sleep(hold).await,
            _ = sleep_until(end) => {}
        }
    }
    let grants = relay.grants.get();
    *relay
        .released_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    if let Err(e) = guard.release().await {
        tally.errors += 1;
        tally.first_error.get_or_insert_with(|| e.to_string());
    }
    if Instant::now() < end {
        tokio::select! {
            _ = relay.grants.above(grants) => {}
            _ = sleep_until(end) => {}
        }
    }
}

/// `renew` and `hold`: `keys` locks held with auto-renewal through the
/// measured window.
async fn hold(setup: &Setup) -> Result<Report> {
    let observed = recorder::install();
    let backend = fencelock::open_backend(&setup.url).await?;
    let clients = clients(&backend, setup.clients)?;
    // Warm the connections and the allocator before the memory baseline.
    for client in &clients {
        let key = format!("{}:warm", setup.run);
        if let Some(guard) = client.lock(key).ttl(setup.ttl).try_acquire().await? {
            guard.release().await?;
        }
    }
    let rss_before = process::rss_bytes();
    let renewed_before = observed.renewals.get();
    let mut tasks = Vec::with_capacity(clients.len());
    for (c, client) in clients.into_iter().enumerate() {
        let keys: Vec<String> = (c..setup.keys)
            .step_by(setup.clients)
            .map(|k| format!("{}:k{k}", setup.run))
            .collect();
        let ttl = setup.ttl;
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::with_capacity(keys.len());
            for key in keys {
                guards.push(client.lock(key).ttl(ttl).acquire().await?);
            }
            Ok::<_, Error>(guards)
        }));
    }
    let mut guards = Vec::with_capacity(setup.keys);
    for task in tasks {
        guards.extend(
            task.await
                .map_err(|e| Error::InvalidArgument(format!("client task: {e}")))??,
        );
    }
    let held = guards.len();
    let mut hold_report = None;
    if setup.scenario == Scenario::Hold {
        // Memory is read once every guard has renewed at least once, so
        // their renewal state is in it too.
        tokio::select! {
            _ = observed.renewals.above(renewed_before + held as u64 - 1) => {}
            _ = tokio::time::sleep(setup.ttl) => {}
        }
        hold_report = Some(Hold {
            locks: held,
            rss_before_bytes: rss_before.unwrap_or(0),
            rss_held_bytes: process::rss_bytes().unwrap_or(0),
            ..Hold::default()
        });
    }
    observed.renew_times.clear();
    let (renewed, failed, lost) = (
        observed.renewals.get(),
        observed.renewal_failures.get(),
        observed.lost.get(),
    );
    let cpu_before = process::cpu_time();
    let window = Instant::now();
    tokio::time::sleep(setup.duration).await;
    let elapsed = window.elapsed();
    let cpu = process::cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    let renewals = Renewals {
        renewed: observed.renewals.get() - renewed,
        failed: observed.renewal_failures.get() - failed,
        lost: observed.lost.get() - lost,
        still_held: 0,
    };
    let latencies = observed.renew_times.snapshot();
    let mut still_held = 0;
    let mut first_error = None;
    for guard in guards {
        if guard.is_valid() {
            match guard.release().await {
                Ok(()) => still_held += 1,
                Err(e) => {
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
    let figures = Figures::new(
        renewals.renewed + renewals.failed,
        renewals.renewed,
        0,
        elapsed,
        &latencies,
        first_error,
    );
    let mut report = report(
        setup,
        backend.name(),
        "one background renewal of a held lock",
        figures,
    );
    report.keys = held;
    report.renewals = Some(Renewals {
        still_held,
        ..renewals
    });
    if let Some(mut h) = hold_report {
        h.bytes_per_lock = h.rss_held_bytes.saturating_sub(h.rss_before_bytes) as f64 / held as f64;
        if let Some(cpu) = cpu {
            h.cpu_seconds = cpu.as_secs_f64();
            h.cpu_percent_of_core = 100.0 * h.cpu_seconds / elapsed.as_secs_f64();
            h.cpu_us_per_lock_second = 1e6 * h.cpu_seconds / elapsed.as_secs_f64() / held as f64;
        }
        report.hold = Some(h);
    }
    Ok(report)
}
