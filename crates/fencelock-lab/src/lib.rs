//! fencelock's laboratory: the code behind `fencelock torture` (fault
//! injection against real servers, checked for stale writes) and
//! `fencelock bench` (the library's cost beside the engine's own limit).
//!
//! It starts throwaway servers and fault proxies from `fencelock-testkit`
//! and opens the backends' raw `baseline` connections, so it is kept out of
//! the library and out of the default `fencelock` binary: `fencelock-cli`
//! links it only with its `lab` feature. Each command has a clap [`Args`]
//! struct and a `run` function answering a [`Verdict`], which the binary
//! turns into its exit code.
//!
//! - [`torture`](mod@torture): `fencelock torture` and its hidden `torture-worker`;
//! - [`bench`](mod@bench): `fencelock bench`;
//! - [`scorecard`](mod@scorecard): `fencelock scorecard`, what one failed
//!   component costs patient clients;
//! - [`topology`]: the multi-datacenter lab `bench --topology` runs in.
//!
//! See `docs/safety.md` and `docs/benchmarks.md`.
//!
//! [`Args`]: clap::Args

pub mod bench;
mod output;
pub mod scorecard;
pub mod topology;
pub mod torture;

use std::time::Duration;

pub use output::Output;

/// How a run ended; the `fencelock` binary maps each to an exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Torture: no violation; bench: the scenario did its work; a torture
    /// worker: it ran until the end.
    Passed,
    /// Torture found a stale write admitted, a lost update or a token
    /// regression.
    Violation,
    /// Bench: nothing completed (the backend is unreachable or failed).
    Incomplete,
    /// Stopped by SIGINT or SIGTERM.
    Interrupted,
}

/// Runs `command` until it ends or SIGINT or SIGTERM comes, whichever is
/// first. Interrupted, the command's future is dropped, and with it every
/// server, proxy and worker it started (each is stopped on drop), so that
/// none outlives the process: [`Verdict::Interrupted`].
async fn until_interrupted(
    what: &str,
    command: impl std::future::Future<Output = Result<Verdict, fencelock::Error>>,
    out: Output,
) -> Result<Verdict, fencelock::Error> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| {
        fencelock::BackendError::message(
            "lab",
            fencelock::ErrorStatus::Permanent,
            format!("cannot watch SIGTERM: {e}"),
        )
    })?;
    let interrupted = || {
        out.note(format_args!(
            "{what} interrupted; its workers, proxies and servers stopped"
        ));
        Ok(Verdict::Interrupted)
    };
    tokio::select! {
        result = command => result,
        _ = tokio::signal::ctrl_c() => interrupted(),
        _ = term.recv() => interrupted(),
    }
}

/// Parses a TTL: a duration within fencelock's bounds.
fn ttl(s: &str) -> Result<Duration, String> {
    fencelock::validate_ttl(fencelock::parse_duration(s)?).map_err(|e| e.to_string())
}
