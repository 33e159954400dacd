//! The host clock that judges SQLite leases.
//!
//! SQLite has no clock of its own, and every process sharing a lock file runs
//! on the same host, so the host's *boot-time* clock (`CLOCK_BOOTTIME`) is the
//! backend clock. Unlike the wall clock it never steps (NTP corrections, a
//! user changing the date), and unlike `CLOCK_MONOTONIC` it keeps counting
//! while the machine is suspended, so a lease taken before a suspend is not
//! extended by it.
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

/// Reads the host clock.
#[derive(Clone, Debug)]
pub(crate) struct HostClock {
    boot_id: &'static str,
}

impl HostClock {
    /// Fails on Linux when the boot id cannot be read: a process that made
    /// one up would disagree with its neighbours about which leases are live
    /// and could take a lock they hold.
    pub(crate) fn new() -> fencelock_core::Result<Self> {
        static BOOT_ID: OnceLock<Result<String, String>> = OnceLock::new();
        let boot_id = BOOT_ID.get_or_init(|| match std::fs::read_to_string(BOOT_ID_PATH) {
            Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
            Ok(_) => Err(format!("{BOOT_ID_PATH} is empty")),
            // Elsewhere every process agrees on the placeholder, and the
            // "renewed in the future" rule alone detects restarted clocks.
            Err(_) if !cfg!(target_os = "linux") => Ok("unknown-boot".to_owned()),
            Err(e) => Err(format!("cannot read {BOOT_ID_PATH}: {e}")),
        });
        match boot_id {
            Ok(id) => Ok(Self { boot_id: id }),
            Err(why) => Err(fencelock_core::BackendError::message(
                crate::error::NAME,
                false,
                format!("the SQLite backend needs the host's boot id: {why}"),
            )
            .into()),
        }
    }

    pub(crate) fn boot_id(&self) -> &'static str {
        self.boot_id
    }

    /// Microseconds since boot, suspend included.
    pub(crate) fn now_us(&self) -> Result<i64, nix::Error> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let id = ClockId::CLOCK_BOOTTIME;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let id = ClockId::CLOCK_MONOTONIC;
        let t = clock_gettime(id)?;
        Ok(t.tv_sec() * 1_000_000 + t.tv_nsec() / 1_000)
    }
}
