//! What this process costs: resident memory (from `/proc/self/statm`) and
//! CPU time (`getrusage`).

use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

/// Resident set size in bytes, where the OS tells (Linux).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()?;
    Some(resident_pages * u64::try_from(page).ok()?)
}

/// User + system CPU time this process has used so far.
pub fn cpu_time() -> Option<Duration> {
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::new(
            u64::try_from(t.tv_sec()).unwrap_or(0),
            u32::try_from(t.tv_usec()).unwrap_or(0) * 1000,
        )
    };
    Some(tv(usage.user_time()) + tv(usage.system_time()))
}
