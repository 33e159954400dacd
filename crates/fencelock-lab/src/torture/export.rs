//! `--history FILE`: the run's history as operations with their call and
//! return times, for a linearizability checker that is not ours
//! (`crates/fencelock-lab/porcupine`, on Porcupine). Two histories per
//! fenced resource:
//!
//! - the **register**: the fenced counter as the workers saw it, with
//!   `admit` (the token offered before reading, fenced runs), `read` (the
//!   value read) and `write` (`read + 1` under a token, admitted or
//!   refused) operations, and a final `read` of the counter after the run;
//! - the **grants**: each grant's token, from the acquire's request to its
//!   answer;
//! - the **holds**: each exclusive grant's trusted interval, acquired
//!   between its request and its answer and released when its trust
//!   ended (the first of release called, loss noticed and the guard's own
//!   deadline), for a mutex per resource: two holders at once leave no
//!   legal order.
//!
//! Beside them, what our own checker concluded, so that the outside one can
//! say whether it agrees. Times are µs on `CLOCK_MONOTONIC` (one clock for
//! every worker process); an operation inside one store transaction took
//! effect at the instant recorded inside it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    checker::{holds, Analysis},
    history::{Event, Kind},
    workload::Workload,
};

/// What the export holds.
#[derive(Debug, Serialize)]
pub struct Export {
    /// The workload (the outside checker needs no more of the set-up).
    pub workload: Workload,
    /// Whether the fence was skipped (the store then admits every write).
    pub unfenced: bool,
    /// Our checker's violations of the register: stale writes admitted,
    /// lost updates, counter mismatches.
    pub checker_register_violations: u64,
    /// Our checker's violations of token order: regressions and split terms.
    pub checker_token_violations: u64,
    /// Our checker's holds that no order of grants explains (counted, not
    /// violations: a backend that forgets leases makes them by design).
    pub checker_hold_overlaps: u64,
    /// Register operations, every resource.
    pub register: Vec<RegisterOp>,
    /// Grants, every resource.
    pub grants: Vec<GrantOp>,
    /// Holds, every resource.
    pub holds: Vec<HoldOp>,
}

/// One operation on a fenced counter.
#[derive(Debug, Serialize)]
pub struct RegisterOp {
    /// The counter.
    pub resource: String,
    /// The worker (`-1`: the harness's final read).
    pub client: i64,
    /// `admit`, `read` or `write`.
    pub op: &'static str,
    /// The token offered (`admit`, `write`).
    pub token: u64,
    /// The value read (`read`, and the value a `write` increments).
    pub value: i64,
    /// `admitted` or `refused` (`admit`, `write`).
    pub admitted: bool,
    /// When it was called, µs.
    pub call: i64,
    /// When it returned, µs.
    pub ret: i64,
}

/// One grant.
#[derive(Debug, Serialize)]
pub struct GrantOp {
    /// The fenced resource the grant's token guards.
    pub resource: String,
    /// The worker.
    pub client: i64,
    /// The token granted.
    pub token: u64,
    /// Acquire requested, µs.
    pub call: i64,
    /// Granted, µs.
    pub ret: i64,
}

/// One exclusive grant's trusted interval.
#[derive(Debug, Serialize)]
pub struct HoldOp {
    /// The resource (one mutex each).
    pub resource: String,
    /// The worker.
    pub client: i64,
    /// The grant's token (for the reader; the mutex does not use it).
    pub token: u64,
    /// Acquire requested, µs.
    pub call: i64,
    /// Granted, µs.
    pub ret: i64,
    /// The trust ended, µs: the release.
    pub end: i64,
}

/// Whether `workload` can be exported: a read-write lock's readers share
/// the counter under a fence mode the register model does not have.
pub fn supported(workload: Workload) -> bool {
    workload != Workload::Rwlock
}

/// The export of a run's `events` (commit order), final `counters` and
/// our checker's `analysis`.
pub fn export(
    workload: Workload,
    unfenced: bool,
    events: &[Event],
    counters: &BTreeMap<String, i64>,
    analysis: &Analysis,
) -> Export {
    let mut register = Vec::new();
    let mut grants = Vec::new();
    let worker = |e: &Event| e.worker.map_or(-1, i64::from);
    for e in events {
        let (Some(resource), Some(token)) = (&e.resource, e.token) else {
            continue;
        };
        let at = |op, value, admitted, call| RegisterOp {
            resource: resource.clone(),
            client: worker(e),
            op,
            token,
            value,
            admitted,
            call,
            ret: e.t_us,
        };
        match e.kind {
            Kind::Grant => grants.push(GrantOp {
                resource: resource.clone(),
                client: worker(e),
                token,
                call: e.t_start_us.unwrap_or(e.t_us),
                ret: e.t_us,
            }),
            Kind::Admit => register.push(at("admit", 0, e.admitted(), e.t_us)),
            Kind::Read => register.push(at("read", e.value_read.unwrap_or(0), true, e.t_us)),
            Kind::Write => register.push(at(
                "write",
                e.value_read.unwrap_or(0),
                e.admitted(),
                e.t_start_us.unwrap_or(e.t_us),
            )),
            _ => {}
        }
    }
    let end = events.iter().map(|e| e.t_us).max().unwrap_or(0) + 1;
    for (resource, value) in counters {
        register.push(RegisterOp {
            resource: resource.clone(),
            client: -1,
            op: "read",
            token: 0,
            value: *value,
            admitted: true,
            call: end,
            ret: end,
        });
    }
    Export {
        workload,
        unfenced,
        checker_register_violations: analysis.stale_writes.count
            + analysis.lost_updates.count
            + analysis.counter_mismatch.count,
        checker_token_violations: analysis.token_regressions.count + analysis.split_terms.count,
        checker_hold_overlaps: analysis.trusted_overlaps,
        register,
        grants,
        holds: holds(events)
            .into_iter()
            .map(|h| HoldOp {
                resource: h.resource,
                client: h.worker.map_or(-1, i64::from),
                token: h.token,
                call: h.requested,
                ret: h.granted,
                end: h.end,
            })
            .collect(),
    }
}
