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
/// when this returns; a server started right after binds it.
pub fn free_port() -> TestResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
            return Err(
                format!("the server for {addr} exited before accepting connections").into(),
            );
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
