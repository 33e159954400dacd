//! What the lab's commands print: one human form, one JSON form, as every
//! `fencelock` command does.

use serde::Serialize;

/// Where and how to print: the binary's `--json` and `--quiet`.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// Print the result as one JSON value on stdout.
    pub json: bool,
    /// Print nothing but errors.
    pub quiet: bool,
}

impl Output {
    /// Prints `value` as JSON (in `--json` mode) or `human` (unless quiet).
    pub(crate) fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce() -> String) {
        if self.json {
            match serde_json::to_string(value) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("fencelock: cannot encode output: {e}"),
            }
        } else if !self.quiet {
            println!("{}", human());
        }
    }

    /// A progress or diagnostic line on stderr, unless quiet.
    pub(crate) fn note(&self, line: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("fencelock: {line}");
        }
    }
}
