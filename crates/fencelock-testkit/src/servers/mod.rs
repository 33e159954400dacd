//! Throwaway real servers for tests.
//!
//! Each server runs from the binaries on `PATH` (or the engine's usual
//! install directory), listens on a free loopback port, keeps its data in a
//! temporary directory, and is killed when its handle is dropped. A missing
//! binary is an error naming the package to install, never a silent skip.

use std::{
    net::{SocketAddr, TcpListener},
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

/// `n` distinct free TCP ports on 127.0.0.1, for the servers of one set.
/// Ports taken one [`free_port`] at a time can repeat (the OS may hand a
/// released port out again at once), and two members of a set on one port
/// is a set that cannot form; holding every listener until all `n` are
/// chosen makes them distinct.
pub fn free_ports(n: usize) -> TestResult<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
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
                crate::report::retry(&format!("{name}: started again on a fresh port ({e})"));
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

/// Waits until the process that `pid` names (its id while it runs, `None`
/// once it has exited) listens on `addr`'s port, or fails after `timeout`,
/// or fails early with [`ExitedAtStart`] when the process exits.
///
/// Whose socket it is matters: a port can be taken by another process
/// between [`free_port`] and the server's bind (another test's server, or
/// a sibling of the same set). A check that merely connects would reach
/// that process and report a server started that is about to exit with
/// "address in use".
pub fn wait_for_port(
    addr: SocketAddr,
    timeout: Duration,
    mut pid: impl FnMut() -> TestResult<Option<u32>>,
) -> TestResult {
    let deadline = Instant::now() + timeout;
    loop {
        let Some(running) = pid()? else {
            return Err(ExitedAtStart(format!(
                "the server for {addr} exited before accepting connections"
            ))
            .into());
        };
        if listens_on(running, addr.port())? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the server for {addr} (pid {running}) did not listen on it within {timeout:?}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Whether process `pid` holds a socket listening on TCP `port`: a LISTEN
/// entry for the port in Linux's `/proc/net/tcp` or `tcp6` whose inode is
/// one of the process's open descriptors.
fn listens_on(pid: u32, port: u16) -> TestResult<bool> {
    let inodes = listening_inodes(port)?;
    if inodes.is_empty() {
        return Ok(false);
    }
    let descriptors = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        // Exited between the caller's check and this one.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("reading /proc/{pid}/fd: {e}").into()),
    };
    // A descriptor can close while the directory is read: skip it.
    Ok(descriptors.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
                .is_some_and(|inode| inodes.contains(&inode))
        })
    }))
}

/// The inodes of the sockets listening on TCP `port`, any local address.
fn listening_inodes(port: u16) -> TestResult<Vec<u64>> {
    /// `st` of a listening socket in `/proc/net/tcp`.
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match std::fs::read_to_string(table) {
            Ok(text) => text,
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if table.ends_with('6') && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(format!(
                    "reading {table}: {e} (the test kit finds which process \
                     listens on a port there, so it runs on Linux)"
                )
                .into())
            }
        };
        // Columns: sl local_address rem_address st tx_queue:rx_queue
        // tr:tm->when retrnsmt uid timeout inode …; a local address is
        // HEXADDR:HEXPORT.
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&LISTEN), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let listens_here = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if let (true, Ok(inode)) = (listens_here, inode.parse()) {
                inodes.push(inode);
            }
        }
    }
    Ok(inodes)
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

    /// The process id while the process runs, `None` once it has exited
    /// (what [`wait_for_port`] follows).
    pub fn running_pid(&mut self) -> TestResult<Option<u32>> {
        Ok(if self.is_running()? { self.pid() } else { None })
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

/// For the tests of first starts: how a test takes a port from the server
/// about to start on it.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Taken {
    /// The local port of a connected client socket, as an outgoing
    /// connection takes one by chance: nothing listens there.
    ByConnection,
    /// A listener of this process, as another test's server holds one.
    ByListener,
}

/// A port taken `how`, and the sockets to keep for as long as it is to
/// stay taken.
#[cfg(test)]
pub(crate) fn taken_port(
    how: Taken,
) -> TestResult<(u16, TcpListener, Option<std::net::TcpStream>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(match how {
        Taken::ByListener => (listener.local_addr()?.port(), listener, None),
        Taken::ByConnection => {
            let client = std::net::TcpStream::connect(listener.local_addr()?)?;
            (client.local_addr()?.port(), listener, Some(client))
        }
    })
}

/// For the tests of first starts: gives `server` a port taken `how`, starts
/// it with [`first_start`], and checks that it moved to a port it serves on.
#[cfg(test)]
pub(crate) fn check_moves_off_a_taken_port<S, T>(
    how: Taken,
    name: &str,
    server: &mut S,
    port: impl Fn(&mut S) -> &mut u16,
    start: impl Fn(&mut S) -> TestResult<T>,
) -> TestResult<T> {
    let (taken, _listener, _client) = taken_port(how)?;
    *port(server) = taken;
    let started = first_start(name, server, &port, start)?;
    let now = *port(server);
    assert_ne!(now, taken, "{name} claims the port taken {how:?}");
    std::net::TcpStream::connect(("127.0.0.1", now))?;
    Ok(started)
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    /// The listener check follows sockets to their process: this process's
    /// listener is its own, and neither another process's nor another
    /// port's.
    #[test]
    fn a_listener_is_found_in_its_own_process_only() -> TestResult {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let (unused, _listener, _client) = taken_port(Taken::ByConnection)?;
        assert!(listens_on(std::process::id(), port)?);
        assert!(!listens_on(std::process::id(), unused)?);
        // Rust opens sockets close-on-exec: the child holds none of ours.
        let mut other = ChildProcess::new("sleep", Command::new("sleep").arg("30").spawn()?);
        let pid = other.running_pid()?.ok_or("sleep exited")?;
        assert!(!listens_on(pid, port)?);
        other.kill()
    }

    /// A server started on a port another process listens on exits with
    /// "address in use"; waiting for it must not take the other listener
    /// for the server (a check that only connects would).
    #[test]
    fn a_server_beside_another_listener_is_not_taken_for_started() -> TestResult {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let dir = tempfile::tempdir()?;
        let binary = find_binary("redis-server", &[], "redis-server")?;
        let child = Command::new(binary)
            .args(["--bind", "127.0.0.1", "--port", &addr.port().to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut server = ChildProcess::new("redis-server", child);
        match wait_for_port(addr, Duration::from_secs(20), || server.running_pid()) {
            Err(e) if e.is::<ExitedAtStart>() => Ok(()),
            other => Err(format!("expected the server to exit at start, got {other:?}").into()),
        }
    }

    /// The ports of one set are distinct, however the OS hands them out.
    #[test]
    fn the_ports_of_a_set_are_distinct() -> TestResult {
        let ports = free_ports(200)?;
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "a port repeats: {ports:?}");
        Ok(())
    }
}
