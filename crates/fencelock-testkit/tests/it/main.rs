//! The integration tests of the test kit itself: its servers, proxies and
//! metrics checks.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod claims;
mod metrics;
mod metrics_described;
mod proxy;
