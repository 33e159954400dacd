//! The conformance suite on two-shard maps, one suite per layout of
//! `common::Layout`: SQLite and memory shards, and Redis shards caught in a
//! resharding's join and hand-over phases. One binary, one link, for all.

#[path = "../common/mod.rs"]
mod common;

use std::process::ExitCode;

use common::{Factory, Layout};
use fencelock_testkit::Suite;

fn main() -> ExitCode {
    fencelock_testkit::run_suites([
        Suite::new(Factory::new(Layout::SqliteMemory)),
        Suite::new(Factory::new(Layout::RedisJoin)),
        Suite::new(Factory::new(Layout::RedisHandover)),
    ])
}
