//! A site cut off from the others, scored as `fencelock scorecard` scores
//! one failed component: `fencelock scorecard --topology FILE --engine E
//! --isolate SITE`.
//!
//! Holders in every client site keep locks with renewal, the first on a
//! key of its own site, the next on keys of the next client sites (the
//! sharded engine homes a key in the site its name starts with,
//! [`Lab::key_prefix`]); new callers in every site take a fresh key of
//! their site every 200 ms; and for each lock whose holder is cut off from
//! what serves its key, a waiter on the side that still reaches it waits
//! for that key. What serves a key: a majority of the members (the side
//! that keeps one), or for the sharded engine the key's home shard alone
//! (the side it stands on: each side keeps the keys homed there). The site
//! is then isolated (every link with one end there swallows everything)
//! for twice the TTL, and healed. The case counts:
//!
//! - **unnecessary losses**: holders on the same side as what serves their
//!   key that lost their lock;
//! - **expected losses**: holders cut off from what serves their key that
//!   lost it, as they must before their keys go elsewhere;
//! - **early grants**: keys granted to a waiter before their holder had
//!   learned it lost them, on this process's one clock (must be 0: two
//!   holders at once), and waiters' tokens not above the holder's (must
//!   be 0);
//! - per site, the new callers' failed calls (wait covering the partition)
//!   and the longest stretch without a grant, and for the isolated site
//!   the time from the heal to its first grant.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use fencelock::{Error, FencingToken, LockGuard};
use fencelock_testkit::TestResult;
use serde::Serialize;
use tokio::time::Instant;

use super::{Lab, LabEngine};
use crate::scorecard::{client, take_and_release, within_wait, Calls};

/// How often each site's new caller starts.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// Holders per client site.
const HOLDERS: usize = 2;

/// One partition's figures.
#[derive(Debug, Serialize)]
pub struct PartitionCase {
    engine: &'static str,
    /// The site cut off.
    isolated: String,
    /// Which side kept a majority of the members: `isolated`, `others`,
    /// or `none`; `homes` for the sharded engine, where each side keeps the
    /// keys homed on its shards.
    majority: &'static str,
    ttl_ms: u64,
    partition_ms: u64,
    holders: usize,
    unnecessary_losses: usize,
    /// Why the first holder lost its lock on the side that still served
    /// its key, if one did.
    first_unnecessary_loss: Option<String>,
    expected_losses: usize,
    /// Of the holders cut off from what serves their key (the side
    /// without a majority; the sharded engine: the key's home across the
    /// cut).
    holders_without_majority: usize,
    /// Keys granted elsewhere before their holder learned it lost them.
    early_grants: usize,
    token_regressions: usize,
    /// Waiters for the lost keys that were never granted (within the
    /// case), and why the first was not.
    waiters_not_granted: usize,
    first_waiter_failure: Option<String>,
    sites: Vec<SiteFigures>,
}

impl PartitionCase {
    /// Two holders at once (a key granted before its holder stopped
    /// trusting it) and tokens out of order: what makes the case fail.
    pub fn violations(&self) -> usize {
        self.early_grants + self.token_regressions
    }

    /// The human form.
    pub fn human(&self) -> String {
        let c = self;
        let ms = |v: Option<u64>| v.map_or("–".to_owned(), |v| format!("{v} ms"));
        let mut text = format!(
            "{} with {} cut off for {} ms (majority: {}; leases {} ms)\n\
             unnecessary losses {} of {}{}; expected losses {} of {}; early grants {}; \
             token regressions {}; waiters not granted {}{}\n\n\
             | site | calls | failed | window | recovery after the heal |\n|---|---|---|---|---|\n",
            c.engine,
            c.isolated,
            c.partition_ms,
            c.majority,
            c.ttl_ms,
            c.unnecessary_losses,
            c.holders - c.holders_without_majority,
            c.first_unnecessary_loss
                .as_ref()
                .map(|f| format!(" (the first: {f})"))
                .unwrap_or_default(),
            c.expected_losses,
            c.holders_without_majority,
            c.early_grants,
            c.token_regressions,
            c.waiters_not_granted,
            c.first_waiter_failure
                .as_ref()
                .map(|f| format!(" (the first: {f})"))
                .unwrap_or_default(),
        );
        for s in &c.sites {
            text.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                s.site,
                s.calls,
                s.failed_calls,
                ms(s.window_ms),
                ms(s.recovery_after_heal_ms)
            ));
        }
        text
    }
}

/// What one client site's callers saw.
#[derive(Debug, Serialize)]
pub struct SiteFigures {
    site: String,
    calls: usize,
    failed_calls: usize,
    first_failure: Option<String>,
    /// The longest stretch after the partition began without a grant.
    window_ms: Option<u64>,
    /// From the heal to the first grant of a caller that started after it
    /// (the isolated site only).
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery_after_heal_ms: Option<u64>,
}

/// A held lock: where, its token, and when its holder learned it lost it.
struct Held {
    site: usize,
    key: String,
    token: FencingToken,
    lost_at: Arc<Mutex<Option<Instant>>>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Isolates `isolate` for `partition`, holders' leases being `ttl`; see
/// the module docs.
pub async fn run(
    lab: &Lab,
    isolate: usize,
    ttl: Duration,
    partition: Duration,
) -> TestResult<PartitionCase> {
    let topology = lab.topology();
    let placed = lab.placed();
    let inside = placed.iter().filter(|&&s| s == isolate).count();
    let majority = placed.len() / 2 + 1;
    let keeps = |site: usize| {
        let side = if site == isolate {
            inside
        } else {
            placed.len() - inside
        };
        side >= majority
    };
    // Whether callers in `site` still reach what serves `key`.
    let serves = |site: usize, key: &str| match lab.home_of(key) {
        Some(home) => (home == isolate) == (site == isolate),
        None => keeps(site),
    };
    let run = format!("partition-{}", std::process::id());
    // The longest any caller may have to wait: the partition, then a
    // lease to end, then the round trips of a slow recovery.
    let patience = partition + ttl * 3;

    let mut backends = Vec::new();
    for &site in topology.clients() {
        let url = lab.url_from(site).ok_or("a client site has no URL")?;
        backends.push((site, fencelock::open_backend(url).await?));
    }
    let mut guards: Vec<(Held, LockGuard)> = Vec::new();
    let clients = topology.clients();
    for (at, (site, backend)) in backends.iter().enumerate() {
        let client = client(backend, &format!("holder-{site}"))?;
        for i in 0..HOLDERS {
            let home = clients[(at + i) % clients.len()];
            let key = format!("{}{run}:held:{site}:{i}", lab.key_prefix(home));
            let guard = client.lock(key.as_str()).ttl(ttl).acquire().await?;
            let lost_at = Arc::new(Mutex::new(None));
            let lost = guard.lost();
            let record = Arc::clone(&lost_at);
            tokio::spawn(async move {
                lost.await;
                *record.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            });
            guards.push((
                Held {
                    site: *site,
                    key,
                    token: guard.token(),
                    lost_at,
                },
                guard,
            ));
        }
    }
    // For each lock whose holder is cut off from what serves its key, a
    // waiter in the first client site that still reaches it.
    let mut waiters = Vec::new();
    for (n, (held, _)) in guards
        .iter()
        .enumerate()
        .filter(|(_, (h, _))| !serves(h.site, &h.key))
    {
        let Some((_, backend)) = backends.iter().find(|(s, _)| serves(*s, &held.key)) else {
            continue;
        };
        let waiter = client(backend, &format!("waiter-{n}"))?;
        let key = held.key.clone();
        waiters.push((
            n,
            tokio::spawn(async move {
                let guard = waiter.lock(key).ttl(ttl).wait(patience).acquire().await?;
                let granted = Instant::now();
                let token = guard.token();
                guard.release().await?;
                Ok::<_, Error>((granted, token))
            }),
        ));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut probers = Vec::new();
    for (site, backend) in &backends {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let (backend, stop, run) = (Arc::clone(backend), stop.clone(), run.clone());
        let prefix = lab.key_prefix(*site);
        let record = Arc::clone(&calls);
        probers.push((
            *site,
            calls,
            tokio::spawn(async move {
                let mut running = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (backend, calls) = (Arc::clone(&backend), Arc::clone(&record));
                    let key = format!("{prefix}{run}:probe:{n}");
                    running.push(tokio::spawn(async move {
                        let started = Instant::now();
                        let outcome =
                            within_wait(patience, take_and_release(&backend, &key, ttl, patience))
                                .await;
                        let mut calls = calls.lock().unwrap_or_else(PoisonError::into_inner);
                        match outcome {
                            Ok(granted) => calls.probes.push((started, Some(granted))),
                            Err(e) => {
                                calls.probes.push((started, None));
                                calls.failures.push(e.to_string());
                            }
                        }
                    }));
                    tokio::time::sleep(PROBE_EVERY).await;
                }
                for task in running {
                    let _ = task.await;
                }
            }),
        ));
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let cut_at = Instant::now();
    lab.isolate(isolate);
    tokio::time::sleep(partition).await;
    lab.heal();
    let healed_at = Instant::now();
    tokio::time::sleep(ttl * 2).await;
    stop.store(true, Ordering::Relaxed);

    // When each holder stopped trusting its lock: when it learned it lost
    // it, or its local deadline if that came first (it stays put once the
    // lock is lost).
    let stopped: Vec<Instant> = guards
        .iter()
        .map(|(held, guard)| {
            let lost_at = *held.lost_at.lock().unwrap_or_else(PoisonError::into_inner);
            lost_at.map_or(guard.trusted_until(), |l| l.min(guard.trusted_until()))
        })
        .collect();
    let mut early = 0;
    let mut regressions = 0;
    let mut waiters_not_granted = 0;
    let mut first_waiter_failure = None;
    for (n, waiter) in waiters {
        let held = &guards[n].0;
        let outcome = match waiter.await {
            Ok(granted) => granted.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok((granted, token)) => {
                if granted < stopped[n] {
                    early += 1;
                }
                if token <= held.token {
                    regressions += 1;
                }
            }
            Err(e) => {
                waiters_not_granted += 1;
                first_waiter_failure.get_or_insert(e);
            }
        }
    }
    let (mut unnecessary, mut expected, mut without) = (0, 0, 0);
    let mut first_unnecessary_loss = None;
    for (held, guard) in guards {
        let lost = !guard.is_valid();
        if serves(held.site, &held.key) {
            unnecessary += usize::from(lost);
            if let Err(e) = guard.check() {
                first_unnecessary_loss.get_or_insert_with(|| e.to_string());
            }
        } else {
            without += 1;
            expected += usize::from(lost);
        }
        // A lost guard's release is refused: nothing to count there.
        let _ = guard.release().await;
    }
    let mut sites = Vec::new();
    for (site, calls, prober) in probers {
        let _ = prober.await;
        let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(PoisonError::into_inner));
        let window = calls.window_after(cut_at);
        let recovery = (site == isolate)
            .then(|| calls.recovery_after(healed_at).map(ms))
            .flatten();
        sites.push(SiteFigures {
            site: topology.sites()[site].clone(),
            calls: calls.probes.len(),
            failed_calls: calls.failures.len(),
            first_failure: calls.failures.into_iter().next(),
            window_ms: window.map(ms),
            recovery_after_heal_ms: recovery,
        });
    }
    Ok(PartitionCase {
        engine: lab.engine().name(),
        isolated: topology.sites()[isolate].clone(),
        majority: if lab.engine() == LabEngine::Sharded {
            "homes"
        } else if keeps(isolate) {
            "isolated"
        } else if placed.len() - inside >= majority {
            "others"
        } else {
            "none"
        },
        ttl_ms: ms(ttl),
        partition_ms: ms(partition),
        holders: topology.clients().len() * HOLDERS,
        unnecessary_losses: unnecessary,
        first_unnecessary_loss,
        expected_losses: expected,
        holders_without_majority: without,
        early_grants: early,
        token_regressions: regressions,
        waiters_not_granted,
        first_waiter_failure,
        sites,
    })
}
