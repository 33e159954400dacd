//! `fencelock run` with a terminal: an interactive command reads it, and a
//! stopped command is reported rather than renewed in silence.
//!
//! Time: real processes. The bound on each step (base [`BOUND`]) is
//! scaled from a [`Patience`] measured first; a failure names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    fs::File,
    io::{Read, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use fencelock_testkit::Patience;

use crate::support::patience;

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
/// The base of every bound: generous, both commands finish at once when
/// they work.
const BOUND: Duration = Duration::from_secs(20);

/// Kills the process if the test fails before it exits.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Everything read from `source` on a channel, chunk by chunk, until it ends.
fn reader(mut source: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // A pty master reads EIO once the last slave closes.
        while let Ok(n @ 1..) = source.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collects output until a whole line contains `needle`, or fails at
/// `p.bound(BOUND)`; returns that line.
fn read_line_with(
    rx: &mpsc::Receiver<Vec<u8>>,
    seen: &mut String,
    needle: &str,
    started: Instant,
    p: &Patience,
) -> String {
    let bound = p.bound(BOUND);
    loop {
        let line = seen
            .split_inclusive('\n')
            .find(|l| l.contains(needle) && l.ends_with('\n'));
        if let Some(line) = line {
            return line.trim_end().to_owned();
        }
        let left = bound.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            Err(_) => panic!("no {needle:?} within {bound:?} [{p}]; output so far: {seen:?}"),
        }
    }
}

fn exit_code(child: &mut Child, started: Instant, p: &Patience) -> i32 {
    let bound = p.bound(BOUND);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().expect("exited normally");
        }
        assert!(
            started.elapsed() < bound,
            "still running after {bound:?} [{p}]"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

#[test]
fn an_interactive_command_reads_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let p = patience();
    let pty = nix::pty::openpty(None, None).unwrap();
    // A new session whose controlling terminal is the pty, as a login shell
    // would have it: fencelock starts in the terminal's foreground group.
    let mut child = {
        let mut cmd = Command::new("setsid");
        cmd.args(["--ctty", "--wait", BIN, "run", "k", "--"])
            .args(["sh", "-c", "read x; echo got:$x"])
            .env("FENCELOCK_URL", sqlite_url(dir.path()))
            .env_remove("RUST_LOG")
            .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(Stdio::from(pty.slave));
        // `cmd` holds the last slave descriptors: dropped with it, so that
        // the master sees the end once the session exits.
        Reaped(cmd.spawn().unwrap())
    };
    let started = Instant::now();
    let mut master = File::from(pty.master);
    let rx = reader(master.try_clone().unwrap());
    master.write_all(b"hello\n").unwrap();
    let mut seen = String::new();
    read_line_with(&rx, &mut seen, "got:hello", started, &p);
    assert_eq!(exit_code(&mut child.0, started, &p), 0, "{seen}");
}

#[test]
fn a_stopped_command_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let p = patience();
    let mut child = Reaped(
        Command::new(BIN)
            .args(["run", "k", "--", "sh", "-c", "kill -STOP $$; echo resumed"])
            .env("FENCELOCK_URL", sqlite_url(dir.path()))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let rx = reader(child.0.stderr.take().unwrap());
    let mut seen = String::new();
    let line = read_line_with(&rx, &mut seen, "is stopped", started, &p);
    assert!(line.contains("SIGSTOP"), "{line}");
    // The message names the process to resume.
    let pid = line
        .split("kill -CONT ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap();
    let resumed = Command::new("kill").args(["-CONT", pid]).status().unwrap();
    assert!(resumed.success(), "{line}");
    assert_eq!(exit_code(&mut child.0, started, &p), 0, "{seen}");
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(out.trim(), "resumed");
}
