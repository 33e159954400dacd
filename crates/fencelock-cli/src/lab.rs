//! `torture`, `bench` and `scorecard` live in the `fencelock-lab` crate, linked only with
//! the `lab` feature: the shipped binary carries no throwaway-server or
//! fault-injection code. Without it, those commands say how to get them.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The commands only a `lab` build has.
const COMMANDS: [&str; 4] = ["torture", "torture-worker", "bench", "scorecard"];

/// The line to print instead of clap's "unrecognized subcommand" when a
/// build without `lab` is asked for one of its commands.
pub fn missing_command(e: &clap::Error) -> Option<String> {
    if cfg!(feature = "lab") || e.kind() != ErrorKind::InvalidSubcommand {
        return None;
    }
    match e.get(ContextKind::InvalidSubcommand) {
        Some(ContextValue::String(name)) => hint(name),
        _ => None,
    }
}

/// How to get `name` if it is a lab command.
fn hint(name: &str) -> Option<String> {
    COMMANDS.contains(&name).then(|| {
        format!(
            "fencelock: `{name}` is not in this build; build fencelock with the lab feature \
             (cargo build --release -p fencelock-cli --features lab)"
        )
    })
}

/// The lab's view of `--json` and `--quiet`.
#[cfg(feature = "lab")]
pub fn output(out: crate::output::Output) -> fencelock_lab::Output {
    fencelock_lab::Output {
        json: out.json,
        quiet: out.quiet,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_only_at_lab_commands() {
        for name in COMMANDS {
            let line = hint(name).expect("a lab command");
            assert!(line.contains(&format!("`{name}`")), "{line}");
            assert!(line.contains("--features lab"), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
        assert_eq!(hint("run"), None);
        assert_eq!(hint("tortur"), None);
    }
}
