//! A throwaway MariaDB server: `mariadb-install-db` into a temporary
//! directory, then `mariadbd` on a free loopback port with its socket in that
//! directory. Authentication is off (`--skip-grant-tables`): it only ever
//! listens on 127.0.0.1 for the test that started it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use super::{
    find_binary, first_start, free_port, running_as_root, wait_for_port, with_log_tail,
    ChildProcess,
};
use crate::TestResult;

const SEARCH: &[&str] = &["/usr/sbin", "/usr/libexec", "/usr/local/mysql/bin"];
const PACKAGE: &str = "mariadb-server";

/// How the server commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `innodb_flush_log_at_trx_commit=2`: survives a server restart, not an
    /// OS crash. Enough for tests.
    Tests,
    /// `innodb_flush_log_at_trx_commit=1`, the default: for benchmarks.
    Production,
}

/// A running (or stopped) throwaway server; dropping it stops it and deletes
/// its data.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<ChildProcess>,
    server: PathBuf,
    port: u16,
    durability: Durability,
    max_connections: u32,
    sql_mode: Option<String>,
    dir: tempfile::TempDir,
}

const DEFAULT_MAX_CONNECTIONS: u32 = 1000;

impl MariaDbServer {
    /// Installs and starts, with [`Durability::Tests`].
    pub fn start() -> TestResult<Self> {
        Self::start_with(Durability::Tests)
    }

    /// Installs and starts.
    pub fn start_with(durability: Durability) -> TestResult<Self> {
        Self::start_full(durability, DEFAULT_MAX_CONNECTIONS)
    }

    /// Installs and starts with [`Durability::Tests`] and
    /// `--max-connections` of `max` (the default is 1000), for tests of
    /// what clients do when the server runs out of connections.
    pub fn start_with_max_connections(max: u32) -> TestResult<Self> {
        Self::start_full(Durability::Tests, max)
    }

    /// Installs and starts with [`Durability::Tests`] and the server's
    /// global `sql_mode` set to `mode` (kept across restarts), e.g. another
    /// engine's default to check that statements keep to a common dialect.
    pub fn start_with_sql_mode(mode: &str) -> TestResult<Self> {
        Self::start_configured(
            Durability::Tests,
            DEFAULT_MAX_CONNECTIONS,
            Some(mode.into()),
        )
    }

    fn start_full(durability: Durability, max_connections: u32) -> TestResult<Self> {
        Self::start_configured(durability, max_connections, None)
    }

    fn start_configured(
        durability: Durability,
        max_connections: u32,
        sql_mode: Option<String>,
    ) -> TestResult<Self> {
        let install = find_binary("mariadb-install-db", SEARCH, PACKAGE)?;
        let server = find_binary("mariadbd", SEARCH, PACKAGE)?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-mariadb-")
            .tempdir()?;
        let mut me = Self {
            child: None,
            server,
            port: free_port()?,
            durability,
            max_connections,
            sql_mode,
            dir,
        };
        // A temporary directory of its own: two bootstraps sharing /tmp can
        // trip over each other's temporary tables.
        std::fs::create_dir(me.tmp_dir())?;
        let mut cmd = Command::new(install);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", me.data_dir().display()))
            .arg(format!("--tmpdir={}", me.tmp_dir().display()))
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"]);
        me.add_user(&mut cmd);
        let out = cmd.stdin(Stdio::null()).output()?;
        if !out.status.success() {
            return Err(format!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        first_start("mariadbd", &mut me, |s| &mut s.port, Self::start_process)?;
        Ok(me)
    }

    fn add_user(&self, cmd: &mut Command) {
        // mariadbd refuses to run as root unless told to; the data directory
        // is then root's own, so nothing needs chowning.
        if running_as_root() {
            cmd.arg("--user=root");
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    fn start_process(&mut self) -> TestResult {
        let flush = match self.durability {
            Durability::Tests => "2",
            Durability::Production => "1",
        };
        let mut cmd = Command::new(&self.server);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--tmpdir={}", self.tmp_dir().display()))
            .arg(format!("--port={}", self.port))
            .arg(format!(
                "--socket={}",
                self.dir.path().join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("mysqld.pid").display()
            ))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-grant-tables",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
            ])
            .arg(format!("--innodb-flush-log-at-trx-commit={flush}"))
            .arg(format!("--max-connections={}", self.max_connections))
            .args(
                self.sql_mode
                    .iter()
                    .map(|mode| format!("--sql-mode={mode}")),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(
                self.dir.path().join("server.log"),
            )?));
        self.add_user(&mut cmd);
        let mut child = ChildProcess::new("mariadbd", cmd.spawn()?);
        let addr = ([127, 0, 0, 1], self.port).into();
        wait_for_port(addr, Duration::from_secs(60), || child.running_pid())
            .map_err(|e| with_log_tail(e, &self.dir.path().join("server.log")))?;
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

    /// A URL for database `db` as `root`.
    pub fn url(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.port)
    }

    /// Clean shutdown (SIGTERM), killed if it takes more than 30 s.
    pub fn stop(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            child.terminate(Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Stops the server and starts it again on the same port and data.
    pub fn restart(&mut self) -> TestResult {
        self.stop()?;
        self.start_process()
    }

    /// SIGKILL: a crash; the next start runs InnoDB crash recovery.
    pub fn kill(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
        }
        Ok(())
    }

    /// Starts the server again on the same port and data after
    /// [`kill`](Self::kill).
    pub fn start_again(&mut self) -> TestResult {
        if self.child.is_some() {
            return Err("mariadbd is still running".into());
        }
        self.start_process()
    }

    /// The server log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl super::url_factory::SqlServer for MariaDbServer {
    const DATABASE: &'static str = "mysql";
    fn start() -> TestResult<Self> {
        MariaDbServer::start()
    }
    fn url(&self, db: &str) -> String {
        MariaDbServer::url(self, db)
    }
    fn restart(&mut self) -> TestResult {
        MariaDbServer::restart(self)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{check_moves_off_a_taken_port, Taken},
        *,
    };

    /// A port taken between `free_port` and mariadbd's bind makes it exit;
    /// the first start moves to a fresh port instead of failing.
    #[test]
    fn a_first_start_on_a_taken_port_moves_to_a_free_one() -> TestResult {
        let mut server = MariaDbServer::start()?;
        server.stop()?;
        check_moves_off_a_taken_port(
            Taken::ByConnection,
            "mariadbd",
            &mut server,
            |s| &mut s.port,
            MariaDbServer::start_process,
        )
    }
}
