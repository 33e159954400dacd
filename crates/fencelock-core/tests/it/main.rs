//! The integration tests of the client, guard and renewer over in-process
//! backends.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod acquire_bounds;
mod guard_paused;
mod layering;
mod one_deadline;
mod queue;
mod renew_backoff;
mod waits;
