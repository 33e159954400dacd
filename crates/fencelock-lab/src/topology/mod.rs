//! The multi-datacenter lab: sites with a latency between each two of
//! them, an engine's members and clients placed in those sites, and every
//! link between two sites delayed by a fault proxy on loopback. `fencelock
//! bench --topology FILE --engine E` measures from each client site
//! (docs/multi-dc.md).
//!
//! - `file`: the topology file, parsed and checked ([`Topology`]);
//! - `lab`: the servers and links it starts ([`Lab`]), and partitions;
//! - `router`: etcd's peer links, one per pair of members;
//! - [`partition`]: a site cut off, scored (`fencelock scorecard
//!   --topology`).

mod file;
mod lab;
pub mod partition;
mod router;

pub use file::{ClientEndpoints, Delay, Topology};
pub use lab::{Lab, LabEngine};

/// Starts the lab of the topology file at `path` with `engine`'s members,
/// saying so on `out`: a file that cannot be read or parsed, or a
/// placement the engine cannot take, is `InvalidArgument` (the CLI's exit
/// 2), servers that do not start a permanent backend error.
pub async fn start(
    path: &std::path::Path,
    engine: LabEngine,
    out: crate::Output,
) -> fencelock::Result<Lab> {
    let topology = load(path).map_err(fencelock::Error::InvalidArgument)?;
    engine
        .check(&topology)
        .map_err(fencelock::Error::InvalidArgument)?;
    out.note(format_args!(
        "starting {} in {} site(s) of {}…",
        engine.name(),
        topology.sites().len(),
        path.display()
    ));
    Lab::start(topology, engine).await.map_err(|e| {
        fencelock::BackendError::message(
            engine.name(),
            fencelock::ErrorStatus::Permanent,
            format!("the lab did not start: {e}"),
        )
        .into()
    })
}

/// Reads and parses the topology file at `path`.
pub fn load(path: &std::path::Path) -> Result<Topology, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read topology {}: {e}", path.display()))?;
    Topology::parse(&text).map_err(|e| format!("topology {}: {e}", path.display()))
}
