//! The run's report: JSON for `--report`/`--json`, a summary for people.

use std::fmt::Write as _;

use serde::Serialize;

use super::{checker::Analysis, nemesis::FaultKind, workload::Workload};

/// How the run was set up.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// The backend's engine (`redis`, `postgres`, …).
    pub backend: String,
    /// The URL (password hidden), when given with `--url`.
    pub url: Option<String>,
    /// The server the harness started, when `--server`.
    pub server: Option<String>,
    /// The lab's topology file, when `--topology` (`backend` is its
    /// engine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// Worker processes.
    pub workers: u32,
    /// Planned run time, seconds.
    pub duration_s: f64,
    /// Requested TTL, milliseconds.
    pub ttl_ms: u64,
    /// The lease the backend granted for that TTL, milliseconds (etcd
    /// rounds up to whole seconds).
    pub lease_ms: u64,
    /// Fault kinds the nemesis chose from.
    pub faults: Vec<FaultKind>,
    /// The nemesis seed: `--seed` replays the schedule.
    pub seed: u64,
    /// Whether the fence was skipped.
    pub unfenced: bool,
    /// The shared key (the semaphore's and the election's name, the prefix
    /// of the multi-key workload's keys).
    pub key: String,
    /// The primitive tortured.
    pub workload: Workload,
    /// The semaphore's permits (semaphore only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Set-up.
    pub config: Config,
    /// Measured run time, seconds.
    pub elapsed_s: f64,
    /// What the history shows.
    pub results: Analysis,
    /// Total violations.
    pub violations: u64,
    /// `ok` or `violations`.
    pub verdict: &'static str,
}

impl Report {
    /// Assembles the report.
    pub fn new(config: Config, elapsed_s: f64, results: Analysis) -> Self {
        let violations = results.violations();
        Self {
            config,
            elapsed_s,
            verdict: if violations == 0 { "ok" } else { "violations" },
            violations,
            results,
        }
    }

    /// The human summary.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let r = &self.results;
        let mut s = String::new();
        let target = c
            .server
            .as_ref()
            .map(|s| format!("{s} (throwaway)"))
            .or_else(|| c.url.clone())
            .unwrap_or_default();
        let workload = match c.permits {
            Some(n) => format!("{} of {n} permits", c.workload.name()),
            None => c.workload.name().to_owned(),
        };
        let _ = writeln!(
            s,
            "torture {} {}: {} workers, {:.0}s, ttl {}ms (lease {}ms), {}, seed {}",
            workload,
            target,
            c.workers,
            self.elapsed_s,
            c.ttl_ms,
            c.lease_ms,
            if c.unfenced { "UNFENCED" } else { "fenced" },
            c.seed
        );
        let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            s,
            "  faults injected   {} ({})",
            r.fault_count(),
            if faults.is_empty() {
                "none".to_owned()
            } else {
                faults.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "  grants            {}   locks lost and noticed {}   overlaps {} (longest {:.0}ms), {} of trusted intervals",
            r.grants, r.locks_lost, r.overlaps, r.longest_overlap_ms, r.trusted_overlaps
        );
        let _ = writeln!(
            s,
            "  writes            {} attempted, {} admitted, {} refused as stale ({} more refused before reading)",
            r.writes_attempted, r.writes_admitted, r.writes_refused, r.admits_refused
        );
        let _ = writeln!(
            s,
            "  final counter     {} ({} admitted increments{})   most writers at once {}",
            r.final_counter,
            r.writes_admitted - r.reader_writes_admitted,
            if r.counters.len() > 1 {
                format!(" over {} counters", r.counters.len())
            } else {
                String::new()
            },
            r.max_concurrent_writers
        );
        if r.reader_writes_admitted > 0 {
            let _ = writeln!(
                s,
                "  readers           {} admitted writes of readers (no counter change)",
                r.reader_writes_admitted
            );
        }
        let _ = writeln!(
            s,
            "  releases          {} found the lease gone, {} failed   acquire errors {} (retried)",
            r.releases_not_held, r.releases_failed, r.errors
        );
        let found = r.found();
        let _ = writeln!(
            s,
            "  violations        {}",
            found
                .iter()
                .map(|(name, f)| format!("{name} {}", f.count))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (_, f) in found {
            for example in f.examples.iter().take(3) {
                let _ = writeln!(s, "    - {}", example.what);
            }
        }
        let _ = write!(
            s,
            "{}: {} violation(s); replay with --seed {}",
            self.verdict.to_uppercase(),
            self.violations,
            c.seed
        );
        s
    }
}
