//! The integration tests of the sharded backend.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

#[path = "../common/mod.rs"]
mod common;
mod renewal;
mod resharding;
