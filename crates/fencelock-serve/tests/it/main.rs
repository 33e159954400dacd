//! The integration tests of the lock service: its HTTP API, dashboard, events
//! and TLS.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod dashboard;
mod fairness;
mod fences;
mod hardening;
mod kv;
mod limits;
mod metrics_bound;
mod notified_events;
mod observability_docs;
mod paging;
mod records;
mod rest;
mod shutdown;
mod support;
mod tls;
