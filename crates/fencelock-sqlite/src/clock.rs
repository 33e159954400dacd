//! The host clock that judges SQLite leases.
//!
//! SQLite has no clock of its own, and every process sharing a lock file runs
//! on the same host, so the host's *boot-time* clock (`CLOCK_BOOTTIME`) is the
//! backend clock. Unlike the wall clock it never steps (NTP corrections, a
//! user changing the date), and unlike `CLOCK_MONOTONIC` it keeps counting
//! while the machine is suspended, so a lease taken before a suspend is not
//! extended by it.
//!
//! A Linux *time namespace* (`unshare -T --boottime N`) shifts that clock by
//! a fixed offset for the processes inside it, while they still share the
//! host's lock files and boot id. Every process therefore subtracts its
//! namespace's offset, published in `/proc/self/timens_offsets`, so that all
//! processes of the host read the one clock of the initial namespace.
//!
//! A boot-time reading means nothing after a reboot, so every lease records
//! the kernel's boot id; a lease from another boot is expired (its holder did
//! not survive the reboot). As a second line of defence, a lease whose last
//! renewal lies in the *future* of the clock is also expired: the clock must
//! have restarted.

use std::sync::OnceLock;

use nix::time::{clock_gettime, ClockId};

/// Where Linux publishes the id of the current boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Where Linux publishes this process's time-namespace clock offsets. The
/// file shows the namespace of the process's future children, which is its
/// own namespace unless it called `unshare(CLONE_NEWTIME)` without exec'ing
/// since; fencelock never does.
const TIMENS_OFFSETS_PATH: &str = "/proc/self/timens_offsets";

/// Reads the host clock.
#[derive(Clone, Debug)]
pub(crate) struct HostClock {
    boot_id: &'static str,
    /// What this process's time namespace adds to the boot-time clock, in
    /// microseconds (zero outside any namespace).
    offset_us: i64,
}

impl HostClock {
    /// Fails on Linux when the boot id or the time-namespace offsets cannot
    /// be read: a process that made them up would disagree with its
    /// neighbours about which leases are live and could take a lock they hold.
    pub(crate) fn new() -> fencelock_core::Result<Self> {
        static HOST: OnceLock<Result<(String, i64), String>> = OnceLock::new();
        let host = HOST.get_or_init(|| Ok((read_boot_id()?, read_offset_us()?)));
        match host {
            Ok((id, offset_us)) => Ok(Self {
                boot_id: id,
                offset_us: *offset_us,
            }),
            Err(why) => Err(fencelock_core::BackendError::message(
                crate::error::NAME,
                fencelock_core::ErrorStatus::Permanent,
                format!("the SQLite backend cannot read the host clock: {why}"),
            )
            .into()),
        }
    }

    pub(crate) fn boot_id(&self) -> &'static str {
        self.boot_id
    }

    /// Microseconds since boot, suspend included, on the clock of the
    /// host's initial time namespace.
    pub(crate) fn now_us(&self) -> Result<i64, nix::Error> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let id = ClockId::CLOCK_BOOTTIME;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let id = ClockId::CLOCK_MONOTONIC;
        let t = clock_gettime(id)?;
        Ok(t.tv_sec() * 1_000_000 + t.tv_nsec() / 1_000 - self.offset_us)
    }
}

fn read_boot_id() -> Result<String, String> {
    match std::fs::read_to_string(BOOT_ID_PATH) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        Ok(_) => Err(format!("{BOOT_ID_PATH} is empty")),
        // Elsewhere every process agrees on the placeholder, and the
        // "renewed in the future" rule alone detects restarted clocks.
        Err(_) if !cfg!(target_os = "linux") => Ok("unknown-boot".to_owned()),
        Err(e) => Err(format!("cannot read {BOOT_ID_PATH}: {e}")),
    }
}

/// The boot-time offset of this process's time namespace, in microseconds.
fn read_offset_us() -> Result<i64, String> {
    match std::fs::read_to_string(TIMENS_OFFSETS_PATH) {
        Ok(text) => parse_boottime_offset_us(&text)
            .map_err(|why| format!("unexpected contents of {TIMENS_OFFSETS_PATH}: {why}")),
        // Kernels without time namespaces (and other systems) have no file
        // and no offsets.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("cannot read {TIMENS_OFFSETS_PATH}: {e}")),
    }
}

/// Reads the `boottime` line of a `timens_offsets` file: lines of
/// `<clock> <seconds> <nanoseconds>`, where the kernel writes `monotonic` and
/// `boottime`. Lines for clocks fencelock does not read are checked for form
/// and otherwise ignored.
fn parse_boottime_offset_us(text: &str) -> Result<i64, String> {
    let mut boottime = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let &[clock, secs, nanos] = fields.as_slice() else {
            return Err(format!("{line:?} is not `<clock> <seconds> <nanoseconds>`"));
        };
        let secs: i64 = secs
            .parse()
            .map_err(|_| format!("{line:?}: seconds {secs:?} is not an integer"))?;
        let nanos: i64 = nanos
            .parse()
            .ok()
            .filter(|n| (0..1_000_000_000).contains(n))
            .ok_or_else(|| format!("{line:?}: nanoseconds {nanos:?} is not in 0..1e9"))?;
        let us = secs
            .checked_mul(1_000_000)
            .and_then(|us| us.checked_add(nanos / 1_000))
            .ok_or_else(|| format!("{line:?}: offset out of range"))?;
        if clock == "boottime" && boottime.replace(us).is_some() {
            return Err("two boottime lines".to_owned());
        }
    }
    boottime.ok_or_else(|| "no boottime line".to_owned())
}

#[cfg(test)]
mod tests {
    use super::parse_boottime_offset_us as parse;

    #[test]
    fn reads_the_boottime_offset() {
        // As Linux prints it: the columns are padded.
        let text = "monotonic           0         0\nboottime         3600         0\n";
        assert_eq!(parse(text), Ok(3_600_000_000));
        assert_eq!(
            parse("boottime -2 500000000\nmonotonic 7 1\n"),
            Ok(-1_500_000)
        );
        assert_eq!(parse("monotonic 0 0\nboottime 0 0\n"), Ok(0));
        assert_eq!(parse("boottime 1 999\n"), Ok(1_000_000));
    }

    #[test]
    fn refuses_malformed_files() {
        for bad in [
            "",
            "monotonic 0 0\n",
            "boottime 3600\n",
            "boottime 3600 0 0\n",
            "boottime x 0\n",
            "boottime 1 -1\n",
            "boottime 1 1000000000\n",
            "boottime 99999999999999999 0\n",
            "monotonic zero 0\nboottime 0 0\n",
            "boottime 1 0\nboottime 2 0\n",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(!err.is_empty(), "{bad:?}");
        }
    }
}
