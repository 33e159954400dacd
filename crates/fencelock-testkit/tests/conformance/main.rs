//! The conformance suite on the test kit's own stores: the in-memory
//! reference backend (`memory.rs`), and `http://` through an in-process
//! `fencelock serve` over SQLite (`http.rs`). One binary, one link, for both.

mod http;
mod memory;

use std::process::ExitCode;

fn main() -> ExitCode {
    fencelock_testkit::run_suites([memory::suite(), http::suite()])
}
