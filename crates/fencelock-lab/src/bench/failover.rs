//! `failover`: how long an election goes without a leader when its leader
//! dies.
//!
//! Each round starts a leader in another process (`fencelock elect NAME
//! --foreground -- sleep …`, the binary this code runs in), waits until it
//! leads, lets this process's standby start campaigning, kills the leader's
//! process group with SIGKILL and times the standby's election. A killed
//! process neither renews nor releases, so no standby can lead before the
//! dead leader's lease runs out on the backend's clock: that floor is read
//! from the backend right after the kill and reported beside the whole, and
//! what the library adds is the difference.

use std::{process::Stdio, sync::Arc, time::Duration};

use fencelock::{Election, Error, LeaderChange, LockClient, Result};
use nix::{sys::signal, unistd::Pid};
use tokio::{
    process::{Child, Command},
    time::{timeout, Instant},
};

use super::{
    driver::Figures,
    recorder::{self, Count},
    report::{Failover, Report},
    scenarios::report,
    stats::Latencies,
    Setup,
};

/// How long the leader process may take to be elected: a process start and
/// a connection, on an election nobody else holds.
const ELECTED_WITHIN: Duration = Duration::from_secs(20);
/// Rounds that fail one after another before the run gives up.
const MAX_FAILED_ROUNDS: u32 = 3;

/// One measured round.
struct Round {
    /// Kill to the standby's election.
    failover: Duration,
    /// The killed leader's lease left at the kill.
    lease_left: Duration,
}

pub async fn run(setup: &Setup) -> Result<Report> {
    let backend = fencelock::open_backend(&setup.url).await?;
    if !backend.capabilities().persistent {
        return Err(Error::InvalidArgument(format!(
            "failover needs a backend that processes share; {} lives in one process",
            backend.name()
        )));
    }
    let exe = std::env::current_exe().map_err(|e| {
        Error::InvalidArgument(format!("cannot find the fencelock binary to elect: {e}"))
    })?;
    let attempts = Arc::clone(&recorder::install().attempts);
    let client = LockClient::builder(Arc::clone(&backend)).build()?;
    let election = client
        .election(format!("{}:failover", setup.run))
        .ttl(setup.ttl);
    // Warms the standby's connections, so the first round is like the rest.
    election.leader().await?;

    let (mut failovers, mut lease_left, mut after_expiry) =
        (Latencies::new(), Latencies::new(), Latencies::new());
    let (mut rounds, mut errors, mut failed_in_a_row) = (0u64, 0u64, 0u32);
    let mut first_error = None;
    let started = Instant::now();
    let end = started + setup.duration;
    while rounds == 0 || Instant::now() < end {
        match round(&exe, setup, &client, &election, &attempts).await {
            Ok(r) => {
                rounds += 1;
                failed_in_a_row = 0;
                failovers.record(r.failover);
                lease_left.record(r.lease_left);
                after_expiry.record(r.failover.saturating_sub(r.lease_left));
            }
            Err(e) => {
                errors += 1;
                failed_in_a_row += 1;
                first_error.get_or_insert(e);
                if failed_in_a_row >= MAX_FAILED_ROUNDS {
                    break;
                }
            }
        }
    }
    let figures = Figures::new(
        rounds,
        rounds,
        errors,
        started.elapsed(),
        &failovers,
        first_error,
    );
    let mut report = report(
        setup,
        backend.name(),
        "failover: SIGKILL of the leader's process to a waiting standby's election",
        figures,
    );
    report.failover = Some(Failover {
        rounds,
        lease_left_ms: lease_left.summary(),
        after_expiry_ms: after_expiry.summary(),
    });
    Ok(report)
}

/// Elects a leader process, kills it, and times the standby's election.
/// The leader process is killed (and reaped) whatever happens.
async fn round(
    exe: &std::path::Path,
    setup: &Setup,
    client: &LockClient,
    election: &Election,
    attempts: &Count,
) -> std::result::Result<Round, String> {
    let mut leader = spawn_leader(exe, setup, election.name())?;
    let outcome = measure(&mut leader, client, election, attempts, setup.ttl).await;
    // Reaps the group leader; its `sleep` went with the group's SIGKILL.
    kill_group(&leader);
    let _ = leader.wait().await;
    outcome
}

async fn measure(
    leader: &mut Child,
    client: &LockClient,
    election: &Election,
    attempts: &Count,
    ttl: Duration,
) -> std::result::Result<Round, String> {
    timeout(ELECTED_WITHIN, elected_elsewhere(client, election))
        .await
        .map_err(|_| match leader.try_wait() {
            Ok(Some(status)) => format!("the leader process exited before it led: {status}"),
            _ => format!("the leader process was not elected within {ELECTED_WITHIN:?}"),
        })??;

    // Bounded, so that a lease that never runs out fails the round.
    let campaign = election.campaign_for(ELECTED_WITHIN + 10 * ttl);
    tokio::pin!(campaign);
    // The kill waits until the standby has tried once and found the
    // leader, so what is timed is a standby already waiting.
    let tried = attempts.get();
    tokio::select! {
        won = &mut campaign => {
            return Err(match won {
                Ok(_) => "the standby was elected while the leader lived".into(),
                Err(e) => format!("the standby's campaign failed: {e}"),
            });
        }
        _ = attempts.above(tried) => {}
    }
    let killed = kill_group(leader).ok_or("the leader process had no pid")?;
    let (won, lease_left) = tokio::join!(
        async {
            let won = (&mut campaign).await;
            (won, Instant::now())
        },
        async {
            // Read after the kill, so that no renewal can extend it later
            // (one already on the wire still could; it is rare and would
            // only make the floor look shorter than it was).
            let leader = election.leader().await;
            (leader, killed.elapsed())
        }
    );
    let (leadership, won_at) = (won.0.map_err(|e| format!("the standby: {e}"))?, won.1);
    let (lease, read_took) = lease_left;
    let lease = lease
        .map_err(|e| format!("reading the dead leader's lease: {e}"))?
        .filter(|l| &l.owner != client.owner())
        .map_or(Duration::ZERO, |l| l.expires_in + read_took);
    leadership
        .resign()
        .await
        .map_err(|e| format!("the standby's resignation: {e}"))?;
    Ok(Round {
        failover: won_at - killed,
        lease_left: lease,
    })
}

/// Waits until someone other than `client` leads `election`.
async fn elected_elsewhere(
    client: &LockClient,
    election: &Election,
) -> std::result::Result<(), String> {
    let mut changes = election
        .observe()
        .await
        .map_err(|e| format!("observing the election: {e}"))?;
    while let Some(change) = changes.next().await {
        match change {
            Ok(LeaderChange::Elected(leader)) if &leader.owner != client.owner() => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("observing the election: {e}")),
        }
    }
    Err("the election's observation ended".into())
}

/// `fencelock elect` in a process group of its own, with its command in the
/// same group (`--foreground`) so that one SIGKILL takes both.
fn spawn_leader(
    exe: &std::path::Path,
    setup: &Setup,
    name: &str,
) -> std::result::Result<Child, String> {
    Command::new(exe)
        .args(["--quiet", "elect", name, "--foreground", "--ttl"])
        .arg(format!("{}ms", setup.ttl.as_millis()))
        .args(["--", "sleep", "3600"])
        // The URL goes by environment: a password in argv shows in `ps`.
        .env("FENCELOCK_URL", &setup.url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the leader process: {e}"))
}

/// SIGKILL to the leader's process group; when it was sent.
fn kill_group(leader: &Child) -> Option<Instant> {
    let pid = i32::try_from(leader.id()?).ok()?;
    // The group may be gone already (the round failed after it exited):
    // nothing is left to kill then.
    let _ = signal::killpg(Pid::from_raw(pid), signal::Signal::SIGKILL);
    Some(Instant::now())
}
