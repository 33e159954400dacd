//! The conformance suite again, on a MariaDB server whose global
//! `sql_mode` is MySQL 8's default: no MySQL 8 server is available to the
//! tests, so this checks the statements under MySQL 8's strictness (see
//! docs/mysql.md for what it does and does not cover).
//!
//! Time: as in `main.rs`, the harness's patience per case; this file sets
//! no figure.

use std::sync::Mutex;

use fencelock_testkit::{
    servers::{mariadb::MariaDbServer, url_factory::UrlServer},
    TestResult,
};

/// MySQL 8.0's default `sql_mode`.
const MYSQL8_SQL_MODE: &str = "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,\
                               NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION";

/// A MariaDB server started in MySQL 8's default mode; everything else is
/// the usual server's.
pub struct Mysql8Mode(Mutex<MariaDbServer>);

impl Mysql8Mode {
    /// Starts the server and checks, with the `mariadb` client on its
    /// socket, that the mode took effect: a run in the ordinary mode would
    /// pass and prove nothing.
    fn start() -> TestResult<Self> {
        let server = MariaDbServer::start_with_sql_mode(MYSQL8_SQL_MODE)?;
        let out = std::process::Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!(
                "--socket={}",
                server.dir().join("mysqld.sock").display()
            ))
            .args(["-uroot", "-N", "-e", "SELECT @@GLOBAL.sql_mode"])
            .output()?;
        let mode = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if mode != MYSQL8_SQL_MODE {
            return Err(format!("the server runs in sql_mode {mode:?}").into());
        }
        Ok(Self(Mutex::new(server)))
    }
}

impl UrlServer for Mysql8Mode {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        Self::start()
    }
    fn url(&self) -> String {
        self.0.url()
    }
    fn case_url(&self, case: usize) -> String {
        self.0.case_url(case)
    }
    fn restart_server(&self) -> TestResult {
        self.0.restart_server()
    }
}
