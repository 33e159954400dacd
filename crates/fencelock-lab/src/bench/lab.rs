//! `fencelock bench --topology FILE --engine E`: the scenario measured from
//! each client site of a multi-datacenter lab, each site's figures beside
//! the physical floor, the round trip to the nearest majority of the
//! members (for the sharded engine, whose keys need no majority, also the
//! round trip to the shard the site's keys are homed on).

use std::time::Duration;

use fencelock::{backend::ErrorStatus, BackendError, Error, Result};
use serde::Serialize;

use super::{report::Report, scenarios, BenchArgs, Setup};
use crate::{
    topology::{self, Lab},
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
    let topology = topology::load(&path).map_err(Error::InvalidArgument)?;
    engine.check(&topology).map_err(Error::InvalidArgument)?;
    out.note(format_args!(
        "starting {} in {} site(s) of {}…",
        engine.name(),
        topology.sites().len(),
        path.display()
    ));
    let lab = Lab::start(topology, engine).await.map_err(|e| {
        BackendError::message(
            engine.name(),
            ErrorStatus::Permanent,
            format!("the lab did not start: {e}"),
        )
    })?;
    let topology = lab.topology();
    let first = topology.clients()[0];
    let setup = Setup::new(lab.url_from(first).unwrap_or_default(), args)?;
    let mut sites = Vec::with_capacity(topology.clients().len());
    for &site in topology.clients() {
        let name = &topology.sites()[site];
        let Some(url) = lab.url_from(site) else {
            continue;
        };
        out.note(format_args!(
            "measuring {} from {name} for {:?}…",
            setup.scenario.name(),
            setup.duration
        ));
        let rtt = lab.nearest_majority_rtt(site);
        let report = scenarios::run(&Setup {
            url: url.to_owned(),
            // A waiter's first try takes a round trip here, not the
            // loopback's microseconds.
            handoff_hold: setup.handoff_hold + rtt * 2,
            // The site's keys, homed in it by the sharded engine.
            run: format!("{}{}", lab.key_prefix(site), setup.run),
            ..setup.clone()
        })
        .await?;
        let in_rtts = |ms: f64| (!rtt.is_zero()).then(|| ms / millis(rtt));
        sites.push(SiteReport {
            site: name.clone(),
            nearest_majority_rtt_ms: millis(rtt),
            home_rtt_ms: lab.home_rtt(site).map(millis),
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

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
