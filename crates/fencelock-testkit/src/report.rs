//! What a test run's summary reports of each test: how long it took and
//! what it had to try again.
//!
//! With `FENCELOCK_TEST_REPORT=FILE` set (`.ci/parallel-tests` sets one
//! per test process), the test kit appends one JSON object a line to FILE:
//!
//! - `{"test": NAME, "seconds": S, "passed": BOOL}` when a conformance case
//!   ends (the harness times each case);
//! - `{"test": NAME, "retry": WHAT}` whenever the kit tries something again
//!   on a test's behalf (a server's first start on a fresh port after a
//!   port clash, a server set laid out again).
//!
//! A retry is not a failure, but a suite that needs retries is one a busy
//! machine can push over: the summary lists every one, and there should be
//! none. Without the variable nothing is written.

use std::{cell::RefCell, io::Write, time::Duration};

/// The variable naming the report file.
pub const REPORT_VAR: &str = "FENCELOCK_TEST_REPORT";

thread_local! {
    /// The conformance case running on this thread, set by the harness.
    static CASE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f` as the test `name` of this thread: [`retry`] names it.
pub(crate) fn as_case<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let previous = CASE.with(|case| case.replace(Some(name.to_owned())));
    let result = f();
    CASE.with(|case| *case.borrow_mut() = previous);
    result
}

/// Records that the test `name` ended after `took`.
pub fn finished(name: &str, took: Duration, passed: bool) {
    append(&serde_json::json!({
        "test": name,
        "seconds": took.as_secs_f64(),
        "passed": passed,
    }));
}

/// Records that the kit tried `what` again for the test running on this
/// thread: the conformance case the harness runs on it, else the thread's
/// name (libtest names a test's thread after the test).
pub fn retry(what: &str) {
    let test = CASE.with(|case| case.borrow().clone()).unwrap_or_else(|| {
        std::thread::current()
            .name()
            .unwrap_or("a test with no name")
            .to_owned()
    });
    append(&serde_json::json!({ "test": test, "retry": what }));
}

fn append(line: &serde_json::Value) {
    let Some(path) = std::env::var_os(REPORT_VAR) else {
        return;
    };
    // One write per line on a file opened for appending: the lines of
    // tests running at once do not interleave.
    let text = format!("{line}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    if let Err(e) = written {
        eprintln!("fencelock-testkit: could not append to {path:?}: {e}");
    }
}
