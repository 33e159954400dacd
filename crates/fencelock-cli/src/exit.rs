//! Exit codes, chosen so scripts can tell the outcomes apart. 75 and 76 are
//! `EX_TEMPFAIL` and the next free sysexits code.

use fencelock::Error;

/// Success.
pub const OK: u8 = 0;
/// The lease is not held by the given owner/token (renew, release,
/// force-release), or the key is free (inspect).
pub const NOT_HELD: u8 = 1;
/// Bad input: unknown flag, bad duration, invalid key, malformed URL, a
/// `--permits` other than the one a semaphore's live permits were taken with,
/// a shard map more than one step from what its shards have seen…
pub const USAGE: u8 = 2;
/// The command could not be started (not found, not executable).
pub const CANNOT_EXEC: u8 = 126;
/// The backend is unreachable or failed (sysexits `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// The lock was not acquired within `--wait` (sysexits `EX_TEMPFAIL`).
pub const NOT_ACQUIRED: u8 = 75;
/// The lock was lost while the command ran; the command was stopped.
pub const LOST: u8 = 76;
/// `fencelock torture` found a stale write admitted, a lost update or a
/// token regression.
#[cfg(feature = "lab")]
pub const VIOLATION: u8 = 3;
/// Interrupted by SIGINT or SIGTERM (128 + SIGINT).
#[cfg(feature = "lab")]
pub const INTERRUPTED: u8 = 130;

/// The exit code for a library error.
pub fn code_for(error: &Error) -> u8 {
    match error {
        Error::Timeout { .. } => NOT_ACQUIRED,
        Error::LockLost { .. } => LOST,
        Error::NotHeld { .. } | Error::Released { .. } | Error::Stale { .. } => NOT_HELD,
        Error::InvalidKey(_)
        | Error::InvalidOwner(_)
        | Error::InvalidTtl(_)
        | Error::InvalidToken(_)
        | Error::InvalidArgument(_)
        | Error::InvalidUrl(_)
        | Error::Unsupported(_)
        | Error::PermitsMismatch { .. } => USAGE,
        _ => UNAVAILABLE,
    }
}

/// The exit code for how `torture` or `bench` ended.
#[cfg(feature = "lab")]
pub fn for_verdict(verdict: fencelock_lab::Verdict) -> u8 {
    use fencelock_lab::Verdict;
    match verdict {
        Verdict::Passed => OK,
        Verdict::Violation => VIOLATION,
        Verdict::Incomplete => UNAVAILABLE,
        Verdict::Interrupted => INTERRUPTED,
    }
}
