//! `fencelock bench`: the library's cost on a backend, measured beside the
//! engine's own limit (`--baseline`) in the same run. See
//! `docs/benchmarks.md`.
//!
//! - `driver`: the one measurement loop (library and raw alike);
//! - `scenarios`: cycle, contended, handoff, renew, hold, semaphore;
//! - `failover`: an elected leader killed with SIGKILL, until a standby leads;
//! - `lab`: the scenario from each site of a multi-datacenter lab
//!   (`--topology`);
//! - `stats`: latency percentiles (HDR histogram);
//! - `recorder`: what the scenarios read from the library's metrics;
//! - `process`: this process's memory and CPU;
//! - `report`: JSON and human output.

mod driver;
mod failover;
mod lab;
mod process;
mod recorder;
mod report;
mod scenarios;
mod stats;

use std::{path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use fencelock::Error;

use crate::{topology::LabEngine, Output, Verdict};

pub use lab::run as run_in_lab;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Uncontended acquire+release, each client on keys of its own.
    Cycle,
    /// All clients try-lock one key without waiting, then release.
    Contended,
    /// Clients alternate on one key, each blocked in acquire when the
    /// other releases; latency = release to the other's grant.
    Handoff,
    /// Locks held longer than the TTL with auto-renewal; renewal success
    /// and latency.
    Renew,
    /// Many locks held at once with auto-renewal: client memory per lock
    /// and CPU.
    Hold,
    /// Acquire (no wait) + release of one permit of a semaphore of
    /// `--permits`, each client in turn.
    Semaphore,
    /// An election's leader (a `fencelock elect` process) killed with
    /// SIGKILL; time until a waiting standby is elected.
    Failover,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Cycle => "cycle",
            Scenario::Contended => "contended",
            Scenario::Handoff => "handoff",
            Scenario::Renew => "renew",
            Scenario::Hold => "hold",
            Scenario::Semaphore => "semaphore",
            Scenario::Failover => "failover",
        }
    }

    /// (clients, keys, duration, ttl) when not given.
    fn defaults(self) -> (usize, usize, Duration, Duration) {
        let s = Duration::from_secs;
        match self {
            Scenario::Cycle => (1, 1, s(10), s(30)),
            Scenario::Contended => (4, 1, s(10), s(30)),
            Scenario::Handoff => (2, 1, s(10), s(30)),
            // Several renewals of every lock within the run.
            Scenario::Renew => (1, 100, s(10), s(2)),
            // At least one renewal of every lock before memory is read
            // (every ttl/3), and one more within the measured window.
            Scenario::Hold => (4, 10_000, s(20), s(30)),
            Scenario::Semaphore => (2, 1, s(10), s(30)),
            // Each round waits out the killed leader's lease: a short TTL
            // gives rounds enough in the default time.
            Scenario::Failover => (1, 1, s(30), s(2)),
        }
    }
}

/// Options of `fencelock bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum)]
    pub scenario: Scenario,

    /// Concurrent clients (tasks) [default: cycle 1, contended 4, handoff 2,
    /// renew 1, hold 4, semaphore 2; failover has one standby].
    #[arg(long)]
    pub clients: Option<usize>,

    /// Keys per client (cycle), or locks held in all (renew, hold)
    /// [default: 1; renew 100; hold 10000].
    #[arg(long)]
    pub keys: Option<usize>,

    /// Measured time [default: 10s; hold 20s; failover 30s, at least one
    /// round].
    #[arg(long, value_parser = fencelock::parse_duration)]
    pub duration: Option<Duration>,

    /// Lease length [default: 30s; renew and failover 2s].
    #[arg(long, value_parser = crate::ttl)]
    pub ttl: Option<Duration>,

    /// Permits of the semaphore (semaphore) [default: 4].
    #[arg(long)]
    pub permits: Option<u32>,

    /// Unmeasured time before each measurement, to warm connections.
    #[arg(long, default_value = "1s", value_parser = fencelock::parse_duration)]
    pub warmup: Duration,

    /// With --baseline, library and raw runs alternate this many times,
    /// each for duration/rounds, so load that drifts on a shared machine
    /// weighs on both alike.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,

    /// Also measure the engine's own limit (the backend's statements,
    /// scripts or RPCs on a raw connection) and print fencelock/limit.
    #[arg(long)]
    pub baseline: bool,

    /// cycle on a `redlock://` URL: also measure, in the same rounds, with
    /// this many of its nodes (the last ones) dead, and print the cycle's
    /// p50 beside the all-alive one. Those nodes are reached through fault
    /// proxies that die after connecting (see --dead-mode).
    #[arg(long, default_value_t = 0)]
    pub dead_nodes: usize,

    /// How the --dead-nodes die: `killed` resets their connections and
    /// refuses new ones (a server killed -9), `silent` swallows every byte
    /// (a paused server, or one cut off by the network).
    #[arg(long, value_enum, default_value = "killed")]
    pub dead_mode: DeadMode,

    /// Measure in a lab instead of on --url: start --engine's servers in
    /// the sites of this topology file, with every link between two sites
    /// delayed, and run the scenario from each client site in turn
    /// (docs/multi-dc.md).
    #[arg(long, requires = "engine")]
    pub topology: Option<PathBuf>,

    /// The engine the lab places in the topology's sites.
    #[arg(long, value_enum, requires = "topology")]
    pub engine: Option<LabEngine>,

    /// With --engine sharded: measure instead from site TO, on keys homed
    /// in site FROM, through the four steps of moving their home to TO
    /// (docs/sharding.md, "Moving a key's home"), one report per step.
    #[arg(long, value_name = "FROM:TO", requires = "topology")]
    pub reshard: Option<String>,
}

/// How `--dead-nodes` die.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeadMode {
    /// Connections reset, new ones refused.
    Killed,
    /// Nothing answers.
    Silent,
}

/// The settled options of one run.
#[derive(Clone, Debug)]
struct Setup {
    url: String,
    scenario: Scenario,
    clients: usize,
    keys: usize,
    duration: Duration,
    ttl: Duration,
    warmup: Duration,
    baseline: bool,
    rounds: u32,
    permits: u32,
    dead_nodes: usize,
    dead_mode: DeadMode,
    /// handoff: how long the holder keeps the lock after the waiter began
    /// trying, so that it releases while the waiter waits, not during its
    /// first try.
    handoff_hold: Duration,
    /// Prefix of every key this run uses, so runs never meet.
    run: String,
}

/// The most keys or clients a run accepts (a typo guard, not a limit of
/// the library).
const MAX_COUNT: usize = 1_000_000;

impl Setup {
    fn new(url: &str, args: BenchArgs) -> Result<Self, Error> {
        let (clients, keys, duration, ttl) = args.scenario.defaults();
        let setup = Self {
            url: url.to_owned(),
            scenario: args.scenario,
            clients: args.clients.unwrap_or(clients),
            keys: args.keys.unwrap_or(keys),
            duration: args.duration.unwrap_or(duration),
            ttl: args.ttl.unwrap_or(ttl),
            warmup: args.warmup,
            baseline: args.baseline,
            rounds: args.rounds,
            permits: args.permits.unwrap_or(4),
            dead_nodes: args.dead_nodes,
            dead_mode: args.dead_mode,
            handoff_hold: scenarios::HANDOFF_HOLD,
            run: format!(
                "fencelock-bench:{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros())
            ),
        };
        let bad = |what: String| Err(Error::InvalidArgument(what));
        if !(1..=MAX_COUNT).contains(&setup.clients) || !(1..=MAX_COUNT).contains(&setup.keys) {
            return bad(format!(
                "--clients and --keys must be between 1 and {MAX_COUNT}"
            ));
        }
        if setup.scenario == Scenario::Handoff && setup.clients < 2 {
            return bad("handoff needs at least 2 clients".into());
        }
        if setup.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        if !(1..=1000).contains(&setup.rounds) {
            return bad("--rounds must be between 1 and 1000".into());
        }
        if args.permits.is_some() && setup.scenario != Scenario::Semaphore {
            return bad("--permits applies to the semaphore scenario only".into());
        }
        if setup.dead_nodes > 0 {
            if setup.scenario != Scenario::Cycle || !setup.url.starts_with("redlock://") {
                return bad(
                    "--dead-nodes applies to the cycle scenario on a redlock:// URL".into(),
                );
            }
            let nodes = fencelock_testkit::proxy::endpoints(&setup.url)
                .map_err(|e| Error::InvalidArgument(format!("--dead-nodes: {e}")))?
                .len();
            if setup.dead_nodes > nodes - (nodes / 2 + 1) {
                return bad(format!(
                    "--dead-nodes {} of {nodes} leaves no majority alive",
                    setup.dead_nodes
                ));
            }
        }
        if !(1..=fencelock::MAX_PERMITS).contains(&setup.permits) {
            return bad(format!(
                "--permits must be between 1 and {}",
                fencelock::MAX_PERMITS
            ));
        }
        if setup.baseline
            && matches!(
                setup.scenario,
                Scenario::Renew | Scenario::Hold | Scenario::Failover
            )
        {
            return bad(format!(
                "--baseline applies to cycle, contended, handoff and semaphore, not {} \
                 (a failover's floor is the lease it waits out, reported in every run)",
                setup.scenario.name()
            ));
        }
        Ok(setup)
    }
}

/// Runs `fencelock bench`: [`Verdict::Passed`] when the scenario did its
/// work (see `report::Report::completed`), [`Verdict::Incomplete`]
/// otherwise.
pub async fn run(url: &str, args: BenchArgs, out: Output) -> Result<Verdict, Error> {
    let setup = Setup::new(url, args)?;
    if !out.json {
        out.note(format_args!(
            "measuring {} for {:?} after a {:?} warm-up{}…",
            setup.scenario.name(),
            setup.duration,
            setup.warmup,
            if setup.baseline {
                ", then the engine's own limit"
            } else {
                ""
            }
        ));
    }
    let report = scenarios::run(&setup).await?;
    out.emit(&report, || report.human());
    Ok(if report.completed() {
        Verdict::Passed
    } else {
        Verdict::Incomplete
    })
}
