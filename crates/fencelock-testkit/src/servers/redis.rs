//! Throwaway `redis-server` processes.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use super::{find_binary, free_port, wait_for_port, ChildProcess};
use crate::TestResult;

/// How long a server gets to accept connections after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A `redis-server` on a free loopback port with its own temporary
/// directory, killed on drop. It can be killed and started again on the
/// same port, with or without persistence.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    persistent: bool,
    process: Mutex<Option<ChildProcess>>,
}

impl RedisServer {
    /// Starts a server without persistence (`--save "" --appendonly no`):
    /// a restart loses every key.
    pub fn start() -> TestResult<Self> {
        Self::start_with(false)
    }

    /// Starts a server with `--appendonly yes --appendfsync always`, so keys
    /// (leases with their absolute expiry, token counters) survive a restart.
    pub fn start_persistent() -> TestResult<Self> {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> TestResult<Self> {
        let server = Self {
            binary: find_binary("redis-server", &[], "redis-server")?,
            port: free_port()?,
            dir: tempfile::tempdir()?,
            persistent,
            process: Mutex::new(None),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&self) -> TestResult {
        let child = Command::new(&self.binary)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args([
                "--appendonly",
                if self.persistent { "yes" } else { "no" },
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut process = ChildProcess::new(format!("redis-server :{}", self.port), child);
        wait_for_port(self.addr(), START_TIMEOUT, || process.is_running())?;
        *self.lock() = Some(process);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/DB`.
    pub fn url(&self, db: u32) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// SIGKILL: a crash. Without persistence every key is gone.
    pub fn kill(&self) -> TestResult {
        if let Some(mut p) = self.lock().take() {
            p.kill()?;
        }
        Ok(())
    }

    /// Sends `signal` to the running server (SIGSTOP pauses it, SIGCONT
    /// resumes it).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> TestResult {
        match self.lock().as_ref() {
            Some(p) => p.signal(signal),
            None => Err(format!("redis-server :{} is not running", self.port).into()),
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn start_again(&self) -> TestResult {
        if self.lock().is_some() {
            return Err("the redis server is still running".into());
        }
        self.spawn()
    }

    /// A clean stop (SIGTERM, so the server flushes what it persists) and a
    /// start on the same port.
    pub fn restart(&self) -> TestResult {
        if let Some(mut p) = self.lock().take() {
            p.terminate(Duration::from_secs(10))?;
        }
        self.spawn()
    }
}

impl super::url_factory::UrlServer for RedisServer {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        // Restart cases expect a clean restart to keep live leases.
        Self::start_persistent()
    }
    fn url(&self) -> String {
        RedisServer::url(self, 0)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
}
