//! The integration tests of the etcd backend against throwaway etcd servers
//! and clusters.
//!
//! One binary per crate, so that the workspace links one executable where it
//! linked one per file; each module is what was a test file of its own, and
//! `.ci/parallel-tests` still runs each module in a process of its own.

mod balance;
mod cluster;
mod etcd_layout;
mod etcd_layout_interop;
mod queue;
mod renewal;
mod timeouts;
mod watch;
