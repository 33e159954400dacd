//! A throwaway PostgreSQL server: `initdb` into a temporary directory, then
//! `postgres` on a free loopback port with its unix socket in that directory.
//! As root, the server runs as the `postgres` user (PostgreSQL refuses root).

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::User};

use super::{
    chown_to, find_binary, first_start, free_port, running_as_root, with_log_tail, ChildProcess,
    ExitedAtStart,
};
use crate::TestResult;

const SEARCH: &[&str] = &["/usr/lib/postgresql/*/bin"];
const PACKAGE: &str = "postgresql";
const DEFAULT_MAX_CONNECTIONS: u32 = 500;

/// How the server commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `fsync=off`: fast, survives a server restart but not an OS crash.
    /// Enough for tests, which restart the server, never the machine.
    Tests,
    /// The defaults: what a production server does, for benchmarks.
    Production,
}

/// A running (or stopped) throwaway server. The data directory lives as long
/// as the handle; dropping it shuts the server down and deletes everything.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<ChildProcess>,
    bin_dir: PathBuf,
    port: u16,
    durability: Durability,
    max_connections: u32,
    run_as: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// `initdb` and start, with [`Durability::Tests`].
    pub fn start() -> TestResult<Self> {
        Self::start_with(Durability::Tests)
    }

    /// `initdb` and start.
    pub fn start_with(durability: Durability) -> TestResult<Self> {
        Self::start_full(durability, DEFAULT_MAX_CONNECTIONS)
    }

    /// `initdb` and start with [`Durability::Tests`] and a server-wide
    /// `max_connections` of `max` (the default is 500), for tests of what
    /// clients do when the server runs out of connections.
    pub fn start_with_max_connections(max: u32) -> TestResult<Self> {
        Self::start_full(Durability::Tests, max)
    }

    fn start_full(durability: Durability, max_connections: u32) -> TestResult<Self> {
        let initdb = find_binary("initdb", SEARCH, PACKAGE)?;
        let bin_dir = initdb
            .parent()
            .ok_or("initdb has no parent directory")?
            // `initdb` on PATH is often a symlink into the versioned dir
            // that also holds `postgres`.
            .canonicalize()?;
        let bin_dir = match std::fs::canonicalize(&initdb)?.parent() {
            Some(real) if real.join("postgres").is_file() => real.to_path_buf(),
            _ => bin_dir,
        };
        if !bin_dir.join("postgres").is_file() {
            return Err(format!(
                "`postgres` was not found next to {}; install the `{PACKAGE}` package",
                initdb.display()
            )
            .into());
        }
        let dir = tempfile::Builder::new().prefix("fencelock-pg-").tempdir()?;
        let run_as = if running_as_root() {
            let user = User::from_name("postgres")?
                .ok_or("running as root needs a `postgres` user to run the server")?;
            chown_to(dir.path(), "postgres")?;
            Some((user.uid.as_raw(), user.gid.as_raw()))
        } else {
            None
        };
        let mut server = Self {
            child: None,
            bin_dir,
            port: free_port()?,
            durability,
            max_connections,
            run_as,
            dir,
        };
        let out = server
            .command("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            .arg("--no-sync")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        first_start(
            "postgres",
            &mut server,
            |s| &mut s.port,
            Self::start_process,
        )?;
        Ok(server)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, binary: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(binary));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd.env_remove("PGDATA");
        cmd
    }

    fn start_process(&mut self) -> TestResult {
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("max_connections={}", self.max_connections))
            .args(["-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(
                self.dir.path().join("server.log"),
            )?));
        if self.durability == Durability::Tests {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        }
        let mut child = ChildProcess::new("postgres", cmd.spawn()?);
        wait_ready(self.dir.path(), &mut child, self.port)?;
        self.child = Some(child);
        Ok(())
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data and socket directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A URL for database `db` as the superuser `postgres` (trust auth).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Fast shutdown (SIGINT: disconnect clients, checkpoint, exit).
    pub fn stop(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            child.signal(Signal::SIGINT)?;
            child.terminate(Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Stops the server and starts it again on the same port and data.
    pub fn restart(&mut self) -> TestResult {
        self.stop()?;
        self.start_process()
    }

    /// SIGKILL to the postmaster: a crash. Its backends notice that the
    /// postmaster is gone and exit on their own; [`start_again`] waits for
    /// them, and the next start runs crash recovery.
    ///
    /// [`start_again`]: Self::start_again
    pub fn kill(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
        }
        Ok(())
    }

    /// Starts the server again on the same port and data after [`kill`].
    /// A start can fail while the killed server's backends still hold its
    /// shared memory; it is retried until they have gone (at most 60 s).
    ///
    /// [`kill`]: Self::kill
    pub fn start_again(&mut self) -> TestResult {
        if self.child.is_some() {
            return Err("postgres is still running".into());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.start_process() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The server log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

/// Waits for the postmaster in `dir` (data under `data`, log in
/// `server.log`) to say `ready` in `postmaster.pid` (accepting TCP is not
/// enough: during recovery the server answers "the database system is
/// starting up").
fn wait_ready(dir: &Path, child: &mut ChildProcess, port: u16) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status =
            std::fs::read_to_string(dir.join("data").join("postmaster.pid")).unwrap_or_default();
        if status.lines().nth(7).is_some_and(|l| l.trim() == "ready") {
            return Ok(());
        }
        if !child.is_running()? {
            let exited = ExitedAtStart(format!("postgres on port {port} exited while starting"));
            return Err(with_log_tail(exited.into(), &dir.join("server.log")));
        }
        if Instant::now() >= deadline {
            return Err(format!("postgres on port {port} was not ready within 60 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl super::url_factory::SqlServer for PostgresServer {
    const DATABASE: &'static str = "postgres";
    fn start() -> TestResult<Self> {
        PostgresServer::start()
    }
    fn url(&self, db: &str) -> String {
        PostgresServer::url(self, db)
    }
    fn restart(&mut self) -> TestResult {
        PostgresServer::restart(self)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{check_moves_off_a_taken_port, taken_port, Taken},
        *,
    };

    /// A port taken between `free_port` and the postmaster's bind makes it
    /// exit; the first start moves to a fresh port instead of failing.
    #[test]
    fn a_first_start_on_a_taken_port_moves_to_a_free_one() -> TestResult {
        let mut server = PostgresServer::start()?;
        server.stop()?;
        check_moves_off_a_taken_port(
            Taken::ByConnection,
            "postgres",
            &mut server,
            |s| &mut s.port,
            PostgresServer::start_process,
        )
    }

    /// A restart keeps its port: its failure is reported, with the log.
    #[test]
    fn a_restart_on_a_taken_port_fails_with_the_servers_words() -> TestResult {
        let mut server = PostgresServer::start()?;
        server.stop()?;
        let (taken, _listener, _client) = taken_port(Taken::ByConnection)?;
        server.port = taken;
        let Err(e) = server.start_process() else {
            panic!("postgres started on a port that is taken");
        };
        assert!(e.is::<ExitedAtStart>(), "not taken for an exit: {e}");
        assert!(
            e.to_string().contains("could not"),
            "the log is not quoted: {e}"
        );
        Ok(())
    }
}
