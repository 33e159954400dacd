//! Process-level fault scenarios with the `fencelock`
//! binary against SQLite and every server engine (throwaway servers from the
//! test kit):
//!
//! - **a stepped wall clock**: `fencelock` processes whose wall clock is
//!   stepped ±1 h, before and *while* they hold a lock, see exclusion and
//!   TTL expiry behave exactly as without the step. The library never uses
//!   a wall clock for a lease decision (guards: monotonic and boot-time
//!   clocks; leases: the backend's clock), and this checks it for real.
//! - **a crashed holder**: `fencelock run` killed with SIGKILL; another
//!   process gets the lock once the lease has run out on the backend, and
//!   not before.
//!
//! The clock is stepped with libfaketime (Debian package `faketime`),
//! preloaded into the `fencelock` processes, reading its offset from a file
//! that the test rewrites while they run. `FAKETIME_DONT_FAKE_MONOTONIC=1`
//! keeps `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` real: an NTP step or a
//! changed date moves only `CLOCK_REALTIME`, and without that variable
//! libfaketime would move the monotonic clocks too (to wall-clock values),
//! which no real machine does. Figures (time to re-acquire after a crash)
//! print with `--nocapture` and are recorded in `docs/faults.md`; they are
//! never asserted.
//!
//! Time: real processes and servers. Each engine's run measures a
//! [`Patience`] first and scales from it the scenarios' lease (base
//! [`TTL`], rounded up to whole seconds for etcd's sake), and with it the
//! phases measured in leases, the waits for a lease to end and the bounds
//! of the polls (bases beside each); a failure names the budget. The lower
//! bounds (a lease lasted its TTL, a re-acquisition came after the
//! reported end) hold whatever the load.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use fencelock_testkit::{
    servers::{
        etcd::EtcdCluster, find_binary, mariadb::MariaDbServer, postgres::PostgresServer,
        redis::RedisServer,
    },
    Patience,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::support::{ms, patience, whole_secs};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// The base of the scenarios' lease: several renewals per phase, and what
/// etcd grants anyway for anything shorter.
const TTL: Duration = Duration::from_secs(2);
/// One hour, the step.
const STEP_SECS: u64 = 3600;

/// An engine run's time: the budget measured at its start and the lease
/// scaled from it.
struct Budget {
    p: Patience,
    ttl: Duration,
    /// `ttl` as `--ttl` takes it.
    ttl_arg: String,
}

impl Budget {
    fn measure() -> Self {
        let p = patience();
        let ttl = whole_secs(p.ttl(TTL));
        Self {
            p,
            ttl,
            ttl_arg: ms(ttl),
        }
    }

    /// A `--wait` or `--ttl` whose base is `base`, as the flag takes it.
    fn flag(&self, base: Duration) -> String {
        ms(self.p.bound(base))
    }
}

/// A wall clock for `fencelock` processes that the test can step while they
/// run.
struct SteppedClock {
    dir: tempfile::TempDir,
    library: PathBuf,
}

impl SteppedClock {
    /// A clock `offset` (libfaketime syntax: `+0`, `+1h`, `-1h`) from the
    /// real one.
    fn new(offset: &str) -> Self {
        // The multi-threaded build: fencelock reads clocks from several
        // threads at once.
        let library = find_binary(
            "libfaketimeMT.so.1",
            &[
                "/usr/lib/*/faketime",
                "/usr/lib/faketime",
                "/usr/lib64/faketime",
                "/usr/local/lib/faketime",
            ],
            "faketime",
        )
        .unwrap();
        let clock = Self {
            dir: tempfile::tempdir().unwrap(),
            library,
        };
        clock.set(offset);
        clock
    }

    fn spec(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// Steps the clock of every process started with it, at their next
    /// reading. Written aside and renamed, so a reader never sees half a
    /// file.
    fn set(&self, offset: &str) {
        let staged = self.dir.path().join("offset.new");
        std::fs::write(&staged, format!("{offset}\n")).unwrap();
        std::fs::rename(staged, self.spec()).unwrap();
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", self.spec())
            // Re-read the file at every clock reading, so a step takes
            // effect at once.
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env_remove("FAKETIME");
    }
}

fn fencelock(url: &str, clock: Option<&SteppedClock>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", url)
        .env_remove("RUST_LOG")
        .args(args);
    if let Some(clock) = clock {
        clock.apply(&mut cmd);
    }
    cmd
}

fn run(url: &str, clock: Option<&SteppedClock>, args: &[&str]) -> Output {
    fencelock(url, clock, args).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

/// The `token=` field of `acquire`'s line (`acquired KEY token=T owner=O …`).
fn token(out: &Output) -> u64 {
    assert_eq!(code(out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    let token = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("token="));
    token
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

/// The lease on `key` as `fencelock --json inspect` reports it.
fn inspect(url: &str, clock: Option<&SteppedClock>, key: &str) -> Option<serde_json::Value> {
    let out = run(url, clock, &["--json", "inspect", key]);
    match code(&out) {
        0 => Some(serde_json::from_slice(&out.stdout).unwrap()),
        1 => None,
        other => panic!(
            "inspect exited {other}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn lease_token(lease: &serde_json::Value) -> u64 {
    lease["token"].as_u64().unwrap()
}

fn expires_in(lease: &serde_json::Value) -> Duration {
    Duration::from_millis(lease["expires_in_ms"].as_u64().unwrap())
}

/// A holder process, killed and reaped if the test fails before it ends.
struct Holder {
    child: Option<Child>,
}

impl Holder {
    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the holder is running")
    }

    fn take(&mut self) -> Child {
        self.child.take().expect("the holder is running")
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls until `key` is held, for at most `p.bound(20 s)`; the lease.
fn wait_until_held(url: &str, key: &str, holder: &mut Child, p: &Patience) -> serde_json::Value {
    let deadline = Instant::now() + p.bound(Duration::from_secs(20));
    loop {
        if let Some(lease) = inspect(url, None, key) {
            return lease;
        }
        assert!(
            holder.try_wait().unwrap().is_none(),
            "the holder of {key} exited before taking it [{p}]"
        );
        assert!(Instant::now() < deadline, "{key} was never taken [{p}]");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A holder whose wall clock is stepped +1 h, then −1 h, while it holds: a
/// rival whose own clock is stepped the other way is refused throughout,
/// the lease keeps its token, and the holder's command ends normally (the
/// lock was never lost). Then leases taken and awaited across a 2 h skew
/// between two processes last their TTL: not less, and not an hour more.
fn clock_step(url: &str, budget: &Budget) {
    let Budget { p, ttl, ttl_arg } = budget;
    let ttl = *ttl;
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let holder_clock = SteppedClock::new("+0");
    let rival_clock = SteppedClock::new("+0");
    // The command prints the wall time it sees when told to stop: proof
    // that the step reached the holder's process tree. It runs in a process
    // group of its own, so it also ends when fencelock is gone (a failed
    // check kills the holder).
    let script = r#"while [ ! -e "$1" ] && kill -0 $PPID; do sleep 0.05; done; date +%s"#;
    let mut holder = Holder {
        child: Some(
            fencelock(
                url,
                Some(&holder_clock),
                &[
                    "run", "stepped", "--ttl", ttl_arg, "--", "sh", "-c", script, "sh",
                ],
            )
            .arg(&stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        ),
    };
    let held = lease_token(&wait_until_held(url, "stepped", holder.child(), p));
    for (holder_offset, rival_offset) in [("+1h", "-1h"), ("-1h", "+1h")] {
        holder_clock.set(holder_offset);
        rival_clock.set(rival_offset);
        // Longer than the TTL: several renewals happen under the step.
        let phase_end = Instant::now() + ttl + ttl / 4;
        let mut attempts = 0;
        while Instant::now() < phase_end {
            let out = run(url, Some(&rival_clock), &["acquire", "stepped"]);
            assert_eq!(
                code(&out),
                75,
                "holder {holder_offset}, rival {rival_offset}: the rival's acquire gave {}: {} \
                 [{p}]",
                code(&out),
                String::from_utf8_lossy(&out.stderr)
            );
            attempts += 1;
            let lease = inspect(url, Some(&rival_clock), "stepped")
                .unwrap_or_else(|| panic!("lease vanished [{p}]"));
            assert_eq!(lease_token(&lease), held, "the lease changed hands [{p}]");
            // The countdown comes from the backend's clock, not the
            // reader's stepped one.
            assert!(expires_in(&lease) <= ttl, "expires in {lease}");
        }
        assert!(attempts > 0);
    }
    std::fs::write(&stop, b"").unwrap();
    let out = holder.take().wait_with_output().unwrap();
    assert_eq!(
        code(&out),
        0,
        "the stepped holder lost its lock: {} [{p}]",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Far from the step either way: the delay between the command's
    // reading and this one, scaled from a minute.
    let near = p.bound(Duration::from_secs(60)).as_secs();
    assert!(
        seen.abs_diff(real - STEP_SECS) < near,
        "the holder's command saw {seen}, real time is {real}: the step did not reach it [{p}]"
    );

    for (taker, waiter) in [("+1h", "-1h"), ("-1h", "+1h")] {
        let key = format!("expiry{taker}");
        let taker_clock = SteppedClock::new(taker);
        let waiter_clock = SteppedClock::new(waiter);
        let before = Instant::now();
        let first = token(&run(
            url,
            Some(&taker_clock),
            &["acquire", &key, "--ttl", ttl_arg],
        ));
        let refused = run(url, Some(&waiter_clock), &["acquire", &key]);
        assert_eq!(code(&refused), 75, "taker {taker}: not excluded [{p}]");
        // The wait covers the lease's end.
        let wait = budget.flag(Duration::from_secs(20));
        let second = token(&run(
            url,
            Some(&waiter_clock),
            &["acquire", &key, "--ttl", "30s", "--wait", &wait],
        ));
        // The lease started after `before` on the backend's clock, so it
        // cannot have ended sooner than a TTL later (1% for clock rates).
        let lasted = before.elapsed();
        assert!(
            lasted >= ttl.mul_f64(0.99),
            "taker {taker}: a {ttl:?} lease ended after {lasted:?}"
        );
        assert!(second > first, "{second} after {first}");
    }
}

/// Kills the `sleep` a crashed `fencelock run` leaves behind (it runs in a
/// process group of its own, so the crash does not reach it).
struct Orphan(PathBuf);

impl Drop for Orphan {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.0.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// `fencelock run` killed with SIGKILL while it holds: another process
/// waiting for the lock gets it once the lease has run out on the backend,
/// and not before. Returns how long after the kill that was, and how long
/// after the earliest end of the lease the backend had reported.
fn holder_crash(url: &str, budget: &Budget) -> (Duration, Duration) {
    let p = &budget.p;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let _orphan = Orphan(pidfile.clone());
    let mut holder = Holder {
        child: Some(
            fencelock(
                url,
                None,
                &[
                    "run",
                    "crashed",
                    "--ttl",
                    &budget.ttl_arg,
                    "--",
                    "sh",
                    "-c",
                    r#"echo $$ > "$1"; exec sleep 60"#,
                    "sh",
                ],
            )
            .arg(&pidfile)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        ),
    };
    let first = lease_token(&wait_until_held(url, "crashed", holder.child(), p));

    // The backend's view just before the crash; renewals after the question
    // only move the end later.
    let asked = Instant::now();
    let lease = inspect(url, None, "crashed")
        .unwrap_or_else(|| panic!("the lease vanished before the crash [{p}]"));
    assert_eq!(lease_token(&lease), first);
    let earliest_end = asked + expires_in(&lease);
    let mut crashed = holder.take();
    crashed.kill().unwrap();
    crashed.wait().unwrap();
    let killed = Instant::now();

    // The wait covers the crashed holder's lease.
    let wait = budget.flag(Duration::from_secs(20));
    let out = run(
        url,
        None,
        &["acquire", "crashed", "--ttl", "30s", "--wait", &wait],
    );
    let reacquired = Instant::now();
    assert!(token(&out) > first);
    assert!(
        reacquired >= earliest_end,
        "re-acquired {:?} before the lease the backend reported could end",
        earliest_end - reacquired
    );
    (reacquired - killed, reacquired - earliest_end)
}

fn exercise(engine: &str, url: &str) {
    // Schema first, so that the scenarios are about clocks and crashes: two
    // processes opening a brand-new SQLite file at once can see "database
    // is locked" from the switch to WAL mode, which SQLite does not retry.
    // (`cleanup`: `list` only reads, and creates nothing.)
    let out = run(url, None, &["cleanup"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let budget = Budget::measure();
    clock_step(url, &budget);
    let (after_kill, after_end) = holder_crash(url, &budget);
    println!(
        "holder crash [{engine}]: re-acquired {after_kill:?} after SIGKILL of a {:?} holder, \
         {after_end:?} after the lease's reported end [{}]",
        budget.ttl, budget.p
    );
}

#[test]
fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    exercise("sqlite", &sqlite_url(&dir.path().join("locks.db")));
}

fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

#[test]
fn postgres() {
    let server = PostgresServer::start().unwrap();
    exercise(
        "postgres",
        &format!("{}?table_prefix=faults_", server.url("postgres")),
    );
}

#[test]
fn mariadb() {
    let server = MariaDbServer::start().unwrap();
    exercise(
        "mysql",
        &format!("{}?table_prefix=faults_", server.url("mysql")),
    );
}

#[test]
fn redis() {
    let server = RedisServer::start().unwrap();
    exercise("redis", &server.url());
}

#[test]
fn etcd() {
    let server = EtcdCluster::start().unwrap();
    exercise("etcd", &server.url());
}
