//! Throwaway real servers for tests.
//!
//! Each server runs from the binaries on `PATH` (or the engine's usual
//! install directory), listens on a free loopback port, keeps its data in a
//! temporary directory, and is killed when its handle is dropped. A missing
//! binary is an error naming the package to install, never a silent skip.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Child,
    time::{Duration, Instant},
};

pub mod mariadb;
pub mod postgres;

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::TestResult;

/// A free TCP port on 127.0.0.1, as the OS hands it out. The port is free
/// when this returns, not necessarily when a server binds it: another test
/// can be handed the same port in between. A server's first start is
/// therefore tried again on a fresh port when it exits before it serves
/// ([`first_start`], [`members::MemberSet::start_with`]).
pub fn free_port() -> TestResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How many times a server's (or a server set's) first start is tried, on
/// fresh ports each time, when a process exits before it serves.
pub const START_ATTEMPTS: u32 = 3;

/// A server process exited before it served. On a first start that is
/// most likely a port taken between [`free_port`] and the server's bind.
#[derive(Debug)]
pub struct ExitedAtStart(pub String);

impl std::fmt::Display for ExitedAtStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExitedAtStart {}

/// Runs `start`, a server's first start, again on a fresh port (written
/// through `port`) when it fails with [`ExitedAtStart`], up to
/// [`START_ATTEMPTS`] times; each retry says so on stderr. Restarts keep
/// their port and do not come here.
pub fn first_start<S, T>(
    name: &str,
    server: &mut S,
    port: impl Fn(&mut S) -> &mut u16,
    start: impl Fn(&mut S) -> TestResult<T>,
) -> TestResult<T> {
    let mut attempt = 1;
    loop {
        match start(server) {
            Err(e) if attempt < START_ATTEMPTS && e.is::<ExitedAtStart>() => {
                eprintln!(
                    "{name}, attempt {attempt} of {START_ATTEMPTS}: {e}; \
                     starting it again on a fresh port"
                );
                *port(server) = free_port()?;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// `error` with the last lines of the server's `log` added (what a server
/// said before it went is the diagnosis), still an [`ExitedAtStart`] if it
/// was one.
pub fn with_log_tail(
    error: Box<dyn std::error::Error + Send + Sync>,
    log: &Path,
) -> Box<dyn std::error::Error + Send + Sync> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    let message = format!("{error} (its log ends: {tail})");
    if error.is::<ExitedAtStart>() {
        ExitedAtStart(message).into()
    } else {
        message.into()
    }
}

/// Finds `binary` on `PATH` or in `extra_dirs`; the error names `package`.
pub fn find_binary(binary: &str, extra_dirs: &[&str], package: &str) -> TestResult<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let extra = extra_dirs
        .iter()
        .flat_map(|pattern| expand_glob_dir(pattern));
    path_dirs
        .into_iter()
        .chain(extra)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!("`{binary}` was not found on PATH; install the `{package}` package").into()
        })
}

/// Expands a directory pattern whose only wildcard is one `*` path segment
/// (e.g. `/usr/lib/postgresql/*/bin`), newest-sorting names first.
fn expand_glob_dir(pattern: &str) -> Vec<PathBuf> {
    let Some((head, tail)) = pattern.split_once("/*/") else {
        return vec![PathBuf::from(pattern)];
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(head)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join(tail))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.reverse();
    dirs
}

/// Waits until something accepts TCP connections on `addr`, or fails after
/// `timeout`, or fails early when `alive` reports the process died.
pub fn wait_for_port(
    addr: SocketAddr,
    timeout: Duration,
    mut alive: impl FnMut() -> TestResult<bool>,
) -> TestResult {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if !alive()? {
            return Err(ExitedAtStart(format!(
                "the server for {addr} exited before accepting connections"
            ))
            .into());
        }
        if Instant::now() >= deadline {
            return Err(
                format!("nothing accepted connections on {addr} within {timeout:?}").into(),
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct ChildProcess {
    child: Option<Child>,
    name: String,
}

impl ChildProcess {
    /// Takes ownership of `child`.
    pub fn new(name: impl Into<String>, child: Child) -> Self {
        Self {
            child: Some(child),
            name: name.into(),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> TestResult<bool> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?.is_none()),
            None => Ok(false),
        }
    }

    /// Sends `signal` (e.g. SIGSTOP to pause, SIGCONT to resume).
    pub fn signal(&self, signal: Signal) -> TestResult {
        let pid = self
            .pid()
            .ok_or_else(|| format!("{} is not running", self.name))?;
        kill(Pid::from_raw(i32::try_from(pid)?), signal)?;
        Ok(())
    }

    /// SIGKILL and reap: a crash, as far as the server can tell.
    pub fn kill(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            // The process may already have exited; reaping is what matters.
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub fn terminate(&mut self, grace: Duration) -> TestResult {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(child.id())?);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while child.try_wait()?.is_none() {
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    child.wait()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Makes `path` and its parents owned by `user` (for servers that refuse to
/// run as root, such as PostgreSQL), using `chown -R`.
pub fn chown_to(path: &Path, user: &str) -> TestResult {
    let status = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{user}:"))
        .arg(path)
        .status()?;
    if !status.success() {
        return Err(format!("chown -R {user} {} failed", path.display()).into());
    }
    Ok(())
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub mod etcd;
pub mod members;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
pub mod redis_set;
pub mod replicas;
pub mod url_factory;
pub mod zookeeper;

/// For the tests of first starts: a port taken as the ones that make a
/// server exit at start are, the local port of a connected client socket.
/// Nothing listens on it, so a server that cannot bind it is not mistaken
/// for one that started. Keep the returned sockets for as long as the port
/// is to stay taken.
#[cfg(test)]
pub(crate) fn taken_port() -> TestResult<(u16, TcpListener, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    Ok((client.local_addr()?.port(), listener, client))
}

/// For the tests of first starts: gives `server` a taken port, starts it
/// with [`first_start`], and checks that it moved to a port it serves on.
#[cfg(test)]
pub(crate) fn check_moves_off_a_taken_port<S, T>(
    name: &str,
    server: &mut S,
    port: impl Fn(&mut S) -> &mut u16,
    start: impl Fn(&mut S) -> TestResult<T>,
) -> TestResult<T> {
    let (taken, _listener, _client) = taken_port()?;
    *port(server) = taken;
    let started = first_start(name, server, &port, start)?;
    let now = *port(server);
    assert_ne!(now, taken, "{name} claims the taken port");
    TcpStream::connect(("127.0.0.1", now))?;
    Ok(started)
}
