//! fencelock's test kit.
//!
//! - [`suite`]: the one conformance suite. Every backend runs the same cases
//!   (I1–I7 of `docs/semantics.md`, admin calls, bad input, guard behaviour) by calling
//!   [`suite::run`] from a `harness = false` test binary; cases that need a
//!   capability the backend lacks are reported as ignored, never as passed.
//! - [`servers`]: throwaway real servers started from the binaries on `PATH`,
//!   on random loopback ports with temporary data directories, so tests can
//!   kill, pause and restart them.
//! - [`fault`]: a [`Backend`](fencelock_core::Backend) wrapper that makes
//!   calls fail or hang, for guard behaviour under an unreachable backend
//!   (re-exported from `fencelock-core`'s `test-util` feature, where the
//!   core's own guard tests use it).
//! - [`txfence`]: the one test of the SQL fences' in-transaction form.
//! - [`sql`]: the other checks the relational engines share.
//! - [`timeouts`]: the checks that connect and operation timeouts hold
//!   against servers that stop answering.
//! - [`patience`]: the measured time budget from which tests against real
//!   servers take their TTLs and bounds, so that a busy machine gets longer
//!   leases instead of a false failure.
//! - [`report`]: each case's time and each retry the kit made, for the
//!   summary of a test run.
//! - [`proxy`]: a TCP fault proxy between clients and a real server:
//!   latency, partitions, refused and reset connections, switched while it
//!   runs.
//! - [`silent`]: a TCP server that accepts connections and never answers,
//!   for connect and operation timeouts.
//! - [`browser`] (feature `browser`): a headless Chromium driven over
//!   WebDriver, for tests of the dashboard of `fencelock serve`.

#[cfg(feature = "browser")]
pub mod browser;
pub mod cases;
pub mod failover;
pub mod patience;
pub mod proxy;
pub mod refusals;
pub mod report;
pub mod servers;
pub mod silent;
pub mod sql;
pub mod suite;
pub mod timeouts;
pub mod txfence;

pub use async_trait::async_trait;
pub use fencelock_core::fault;
pub use patience::Patience;
pub use suite::{run, run_suites, Needs, ProxiedBackend, Store, StoreFactory, Suite, TestResult};
