//! The benchmark's result: one JSON object (`--json`) or a few lines for
//! people, each figure beside the engine's own limit when `--baseline` ran.

use serde::Serialize;

use super::{driver::Figures, stats::LatencySummary};

/// Everything one `fencelock bench` run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    /// The backend's name (`redis`, `postgres`, …).
    pub backend: &'static str,
    /// The URL, passwords hidden.
    pub url: String,
    pub clients: usize,
    pub keys: usize,
    pub duration_s: f64,
    pub ttl_s: f64,
    /// What one operation is in this scenario.
    pub op: &'static str,
    pub fencelock: Figures,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewals: Option<Renewals>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// The semaphore's size (semaphore).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead: Option<Dead>,
}

/// The same operation with some nodes dead (`--dead-nodes`), measured in
/// the same rounds as the all-alive figures.
#[derive(Debug, Serialize)]
pub struct Dead {
    /// How many nodes were dead, and how they died (`killed`, `silent`).
    pub nodes: usize,
    pub mode: &'static str,
    pub figures: Figures,
    /// p50 with the nodes dead ÷ p50 with every node alive (1 = a dead
    /// node costs nothing).
    pub p50_ratio: f64,
    /// ops/s with the nodes dead ÷ ops/s with every node alive.
    pub ops_ratio: f64,
}

impl Dead {
    pub fn new(nodes: usize, mode: &'static str, alive: &Figures, figures: Figures) -> Self {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Self {
            nodes,
            mode,
            p50_ratio: ratio(figures.latency_ms.p50, alive.latency_ms.p50),
            ops_ratio: ratio(figures.ops_per_sec, alive.ops_per_sec),
            figures,
        }
    }
}

/// The engine's own limit, measured in the same run.
#[derive(Debug, Serialize)]
pub struct Baseline {
    /// What the raw operation sends.
    pub raw: String,
    pub figures: Figures,
    /// fencelock ops/s ÷ raw ops/s (higher is better; 1 = the engine's limit).
    pub ops_ratio: f64,
    /// fencelock p50 ÷ raw p50 (lower is better; 1 = the engine's limit).
    pub p50_ratio: f64,
}

impl Baseline {
    pub fn new(raw: String, fencelock: &Figures, figures: Figures) -> Self {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Self {
            raw,
            ops_ratio: ratio(fencelock.ops_per_sec, figures.ops_per_sec),
            p50_ratio: ratio(fencelock.latency_ms.p50, figures.latency_ms.p50),
            figures,
        }
    }
}

/// Background renewals during the measured window.
#[derive(Debug, Default, Serialize)]
pub struct Renewals {
    pub renewed: u64,
    pub failed: u64,
    /// Locks the library declared lost.
    pub lost: u64,
    /// Guards still valid, and released cleanly, at the end.
    pub still_held: u64,
}

/// Client cost of holding many locks at once.
#[derive(Debug, Default, Serialize)]
pub struct Hold {
    pub locks: usize,
    pub rss_before_bytes: u64,
    pub rss_held_bytes: u64,
    /// (RSS while holding − RSS before) ÷ locks.
    pub bytes_per_lock: f64,
    /// CPU (user + system) of this process during the measured window.
    pub cpu_seconds: f64,
    /// The same as a share of one core.
    pub cpu_percent_of_core: f64,
    /// CPU per held lock and second held, in microseconds.
    pub cpu_us_per_lock_second: f64,
}

/// Elections won by a standby after the leader was killed (failover). The
/// figures' latency is the whole failover, kill to election; the floor is
/// the killed leader's lease, which must run out first.
#[derive(Debug, Default, Serialize)]
pub struct Failover {
    /// Rounds measured: leader elected, killed, standby elected.
    pub rounds: u64,
    /// Lease left on the killed leader, read from the backend just before
    /// the kill (the part of a failover no lock can skip).
    pub lease_left_ms: LatencySummary,
    /// Kill to election, less the lease left: what the library adds to the
    /// floor (wake-up or back-off, and the acquire).
    pub after_expiry_ms: LatencySummary,
}

fn figures_line(label: &str, f: &Figures) -> String {
    let cpu = f
        .client_cpu_us_per_op
        .map_or_else(String::new, |us| format!(", client CPU {us:.1} us/op"));
    format!(
        "{label:<10} {:>10.0} ops/s   p50 {:>8.3} ms   p99 {:>8.3} ms   p99.9 {:>8.3} ms   \
         success {:>6.2}%   ({} ops, {} errors{cpu})",
        f.ops_per_sec,
        f.latency_ms.p50,
        f.latency_ms.p99,
        f.latency_ms.p999,
        100.0 * f.success_rate,
        f.ops,
        f.errors,
    )
}

impl Report {
    /// Whether the scenario did its work: operations succeeded, or (renew,
    /// hold) every lock was still held at the end, even if no renewal fell
    /// in a window shorter than a third of the TTL.
    pub fn completed(&self) -> bool {
        match &self.renewals {
            Some(r) => r.still_held == self.keys as u64 && self.keys > 0,
            None => self.fencelock.successes > 0,
        }
    }

    /// The human form.
    pub fn human(&self) -> String {
        let mut lines = vec![
            format!(
                "fencelock bench {} on {} ({}): {} client(s), {} key(s), {:.1} s, ttl {:.1} s",
                self.scenario,
                self.backend,
                self.url,
                self.clients,
                self.keys,
                self.duration_s,
                self.ttl_s
            ),
            format!("one op = {}", self.op),
            figures_line("fencelock", &self.fencelock),
        ];
        if let Some(b) = &self.baseline {
            lines.push(figures_line("raw limit", &b.figures));
            lines.push(format!(
                "{:<10} {:>10.2} x ops/s of the limit, p50 {:.2} x the limit's   (raw = {})",
                "ratio", b.ops_ratio, b.p50_ratio, b.raw
            ));
        }
        if let Some(d) = &self.dead {
            lines.push(figures_line(&format!("{} {}", d.nodes, d.mode), &d.figures));
            lines.push(format!(
                "{:<10} {:>10.2} x ops/s with every node alive, p50 {:.2} x",
                "dead ratio", d.ops_ratio, d.p50_ratio
            ));
        }
        if let Some(r) = &self.renewals {
            lines.push(format!(
                "renewals   {} renewed, {} failed, {} lock(s) lost, {} still held at the end",
                r.renewed, r.failed, r.lost, r.still_held
            ));
        }
        if let Some(h) = &self.hold {
            lines.push(format!(
                "hold       {} locks: RSS {:.1} MiB -> {:.1} MiB = {:.0} bytes/lock; CPU {:.2} s \
                 = {:.1}% of a core = {:.2} us per lock-second",
                h.locks,
                h.rss_before_bytes as f64 / 1048576.0,
                h.rss_held_bytes as f64 / 1048576.0,
                h.bytes_per_lock,
                h.cpu_seconds,
                h.cpu_percent_of_core,
                h.cpu_us_per_lock_second
            ));
        }
        if let Some(p) = self.permits {
            lines.push(format!("permits    {p}"));
        }
        if let Some(f) = &self.failover {
            lines.push(format!(
                "failover   {} rounds: kill to new leader p50 {:.1} ms = lease left p50 {:.1} ms \
                 + after expiry p50 {:.1} ms (p99 {:.1} ms)",
                f.rounds,
                self.fencelock.latency_ms.p50,
                f.lease_left_ms.p50,
                f.after_expiry_ms.p50,
                f.after_expiry_ms.p99
            ));
        }
        for f in std::iter::once(&self.fencelock)
            .chain(self.baseline.as_ref().map(|b| &b.figures))
            .chain(self.dead.as_ref().map(|d| &d.figures))
        {
            if let Some(e) = &f.first_error {
                lines.push(format!("first error: {e}"));
            }
        }
        lines.join("\n")
    }
}
