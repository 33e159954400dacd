//! What the workers do under the lock: which primitive they take, and which
//! fenced resources (counters) a grant covers.

use clap::ValueEnum;
use serde::Serialize;

/// The coordination primitive a run tortures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// One exclusive lock; every holder increments one counter.
    #[default]
    Lock,
    /// A semaphore of `--permits` permits; a permit holder increments its
    /// slot's counter, fenced with the slot's token.
    Semaphore,
    /// A read-write lock: readers read the counter and record that they
    /// still held the read when done, writers increment it; both fenced in
    /// their mode (`admit_shared`).
    Rwlock,
    /// A leader election; the leader increments one counter with its term
    /// as the token.
    Election,
    /// All-or-nothing locks on 2–3 of a few keys, listed in random order;
    /// each key's counter is incremented under that key's token.
    Multi,
}

/// How many keys the `multi` workload draws from: few, so that the sets
/// of different workers overlap most of the time.
pub const MULTI_KEYS: u32 = 4;

impl Workload {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::Semaphore => "semaphore",
            Workload::Rwlock => "rwlock",
            Workload::Election => "election",
            Workload::Multi => "multi",
        }
    }
}

/// The fenced resource (and counter) of semaphore slot `slot`.
pub fn slot_resource(key: &str, slot: u32) -> String {
    format!("{key}-slot-{slot}")
}

/// Key `i` of the `multi` workload, also the resource its token fences.
pub fn multi_key(key: &str, i: u32) -> String {
    format!("{key}-key-{i}")
}
