//! The integration tests of the `fencelock` binary, run as a user runs it
//! (the `torture`, `bench`, `lab` and `scorecard` modules need the `lab` feature, which gives the
//! binary those commands).
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

#[cfg(feature = "lab")]
mod bench;
mod cli;
mod connections;
mod election;
mod engines;
mod etcd_loss;
#[cfg(feature = "lab")]
mod lab;
mod lock_delay;
mod loss_report;
mod multi;
mod process_faults;
mod replicas;
mod rwlock;
#[cfg(feature = "lab")]
mod scorecard;
mod semaphore;
mod serve;
mod sharded;
mod support;
mod terminal;
mod time_namespace;
mod timeouts;
#[cfg(feature = "lab")]
mod torture;
