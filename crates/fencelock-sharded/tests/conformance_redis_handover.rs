//! The conformance suite on a two-shard map (see `common::Layout::RedisHandover`).

mod common;

fn main() -> std::process::ExitCode {
    fencelock_testkit::run(common::Factory::new(common::Layout::RedisHandover))
}
