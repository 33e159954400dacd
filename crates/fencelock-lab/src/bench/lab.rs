//! `fencelock bench --topology FILE --engine E`: the scenario measured from
//! each client site of a multi-datacenter lab, each site's figures beside
//! the physical floor, the round trip to the nearest majority of the
//! members (for the sharded engine, whose keys need no majority, also the
//! round trip to the shard the site's keys are homed on).

use std::time::Duration;

use fencelock::{Error, Result};
use serde::Serialize;

use super::{report::Report, scenarios, BenchArgs, Setup};
use crate::{
    topology::{self, Lab, LabEngine},
    Output, Verdict,
};

/// What one lab run measured.
#[derive(Debug, Serialize)]
pub struct LabReport {
    /// The topology file.
    pub topology: String,
    pub engine: &'static str,
    /// Members, and in which site each stands.
    pub members: Vec<String>,
    /// The delayed links the lab ran.
    pub links: usize,
    pub sites: Vec<SiteReport>,
}

/// The scenario as measured by clients standing in one site.
#[derive(Debug, Serialize)]
pub struct SiteReport {
    pub site: String,
    /// The round trip from this site to the nearest majority of the
    /// members (one member: to it), without jitter: the floor of one
    /// operation that needs a majority's answer.
    pub nearest_majority_rtt_ms: f64,
    /// The sharded engine: the round trip from this site to the shard its
    /// keys are homed on (0 where one stands in the site), the floor of
    /// one operation there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home_rtt_ms: Option<f64>,
    /// The p50 and p99 of one op in those round trips (`None` when every
    /// member stands in this site).
    pub p50_rtts: Option<f64>,
    pub p99_rtts: Option<f64>,
    pub report: Report,
}

impl LabReport {
    fn completed(&self) -> bool {
        self.sites.iter().all(|s| s.report.completed())
    }

    fn human(&self) -> String {
        let mut lines = vec![format!(
            "fencelock bench in the lab {} on {}: members in {}; {} delayed link(s)",
            self.topology,
            self.engine,
            self.members.join(", "),
            self.links
        )];
        for s in &self.sites {
            lines.push(String::new());
            lines.push(format!(
                "from {}: {}nearest majority {:.1} ms round trip{}",
                s.site,
                s.home_rtt_ms
                    .map(|ms| format!("its keys' home {ms:.1} ms round trip; "))
                    .unwrap_or_default(),
                s.nearest_majority_rtt_ms,
                match (s.p50_rtts, s.p99_rtts) {
                    (Some(p50), Some(p99)) => {
                        format!("; one op p50 {p50:.2} round trips, p99 {p99:.2}")
                    }
                    _ => String::new(),
                }
            ));
            lines.push(s.report.human());
        }
        lines.join("\n")
    }
}

/// Runs the scenario of `args` from each client site of the lab its
/// `--topology` and `--engine` name.
pub async fn run(args: BenchArgs, out: Output) -> Result<Verdict> {
    crate::until_interrupted("bench", in_lab(args, out), out).await
}

async fn in_lab(args: BenchArgs, out: Output) -> Result<Verdict> {
    let (Some(path), Some(engine)) = (args.topology.clone(), args.engine) else {
        return Err(Error::InvalidArgument(
            "--topology and --engine go together".into(),
        ));
    };
    let lab = topology::start(&path, engine, out).await?;
    let topology = lab.topology();
    let first = topology.clients()[0];
    let reshard = match args.reshard.as_deref() {
        Some(moving) => Some(reshard_sites(&lab, moving)?),
        None => None,
    };
    let setup = Setup::new(lab.url_from(first).unwrap_or_default(), args)?;
    let measured = match reshard {
        Some((from, to)) => reshard_steps(&lab, &setup, from, to)?,
        None => topology
            .clients()
            .iter()
            .filter_map(|&site| {
                Some(Measured {
                    label: topology.sites()[site].clone(),
                    site,
                    url: lab.url_from(site)?.to_owned(),
                    // The site's keys, homed in it by the sharded engine.
                    run: format!("{}{}", lab.key_prefix(site), setup.run),
                    home_rtt: lab.home_rtt(site),
                })
            })
            .collect(),
    };
    let mut sites = Vec::with_capacity(measured.len());
    for m in measured {
        out.note(format_args!(
            "measuring {} from {} for {:?}…",
            setup.scenario.name(),
            m.label,
            setup.duration
        ));
        let rtt = lab.nearest_majority_rtt(m.site);
        let report = scenarios::run(&Setup {
            url: m.url,
            // A waiter's first try takes a round trip here, not the
            // loopback's microseconds.
            handoff_hold: setup.handoff_hold + rtt.max(m.home_rtt.unwrap_or_default()) * 2,
            run: m.run,
            ..setup.clone()
        })
        .await?;
        let in_rtts = |ms: f64| (!rtt.is_zero()).then(|| ms / millis(rtt));
        sites.push(SiteReport {
            site: m.label,
            nearest_majority_rtt_ms: millis(rtt),
            home_rtt_ms: m.home_rtt.map(millis),
            p50_rtts: in_rtts(report.fencelock.latency_ms.p50),
            p99_rtts: in_rtts(report.fencelock.latency_ms.p99),
            report,
        });
    }
    let report = LabReport {
        topology: path.display().to_string(),
        engine: engine.name(),
        members: lab
            .placed()
            .iter()
            .map(|&s| topology.sites()[s].clone())
            .collect(),
        links: lab.links(),
        sites,
    };
    out.emit(&report, || report.human());
    Ok(if report.completed() {
        Verdict::Passed
    } else {
        Verdict::Incomplete
    })
}

/// One measurement of a lab run: from where, on which URL and keys.
struct Measured {
    /// The site, as the report names it.
    label: String,
    site: usize,
    url: String,
    /// The prefix of the measurement's keys.
    run: String,
    /// The round trip to the farthest shard the keys are taken on (the
    /// sharded engine).
    home_rtt: Option<Duration>,
}

/// `--reshard FROM:TO`: the two sites, checked.
fn reshard_sites(lab: &Lab, moving: &str) -> Result<(usize, usize)> {
    let bad = |what: String| Error::InvalidArgument(format!("--reshard {moving:?}: {what}"));
    if lab.engine() != LabEngine::Sharded {
        return Err(bad("applies to --engine sharded".into()));
    }
    let (from, to) = moving
        .split_once(':')
        .ok_or_else(|| bad("expected FROM:TO, two sites".into()))?;
    let site = |name: &str| {
        lab.topology()
            .site(name)
            .filter(|&s| lab.placed().contains(&s))
            .ok_or_else(|| bad(format!("{name:?} is not a site with a shard")))
    };
    let (from, to) = (site(from)?, site(to)?);
    if from == to || !lab.topology().clients().contains(&to) {
        return Err(bad(
            "TO must be a client site other than FROM (its clients are measured)".into(),
        ));
    }
    Ok((from, to))
}

/// The four steps of moving the home of keys written from `to` from
/// `from`'s shard to `to`'s, each measured from `to` in turn. Their keys
/// start with `to`'s prefix and `moving:`, a longer prefix than the
/// site's own rule, so that the step's rule decides.
fn reshard_steps(lab: &Lab, setup: &Setup, from: usize, to: usize) -> Result<Vec<Measured>> {
    let prefix = format!("{}moving:", lab.key_prefix(to));
    let urls = lab
        .reshard_urls(to, &prefix, from, to)
        .map_err(|e| Error::InvalidArgument(format!("--reshard: {e}")))?;
    let sites = lab.topology().sites();
    let far = lab.topology().rtt(to, from);
    let steps = ["old map", "join", "handover", "new map"];
    Ok(urls
        .into_iter()
        .zip(steps)
        .enumerate()
        .map(|(i, (url, step))| Measured {
            label: format!(
                "{} (step {}, {step}: keys homed in {} moving to {})",
                sites[to],
                i + 1,
                sites[from],
                sites[to]
            ),
            site: to,
            url,
            run: format!("{prefix}{}", setup.run),
            // Until the new map, every grant takes the old home too.
            home_rtt: Some(if i < 3 { far } else { Duration::ZERO }),
        })
        .collect())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
