//! Several `fencelock serve` replicas over one backend, and HAProxy in front
//! of them: the lock service as it runs in production, for tests and the
//! torture harness to crash replicas under load.
//!
//! The test kit does not link the service: it runs the `fencelock` binary
//! it is given (a test's `CARGO_BIN_EXE_fencelock`, or the harness's own
//! executable), so the replicas are real processes that `kill -9` ends.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use nix::sys::signal::Signal;

use super::{
    find_binary, first_start, free_port, free_ports, wait_for_port, ChildProcess, ExitedAtStart,
};
use crate::TestResult;

/// `fencelock serve` processes over one backend URL, each on a port of its
/// own that it keeps across restarts.
#[derive(Debug)]
pub struct ServeReplicas {
    binary: PathBuf,
    backend: String,
    args: Vec<String>,
    ports: Vec<u16>,
    processes: Vec<Mutex<Option<ChildProcess>>>,
}

impl ServeReplicas {
    /// Starts `n` replicas of `binary serve` over `backend`, with `args`
    /// added to each command line (e.g. `--token-file`); returns once each
    /// has printed its listening line.
    pub fn start(binary: &Path, backend: &str, n: usize, args: &[&str]) -> TestResult<Self> {
        let mut replicas = Self {
            binary: binary.to_owned(),
            backend: backend.to_owned(),
            args: args.iter().map(|&a| a.to_owned()).collect(),
            ports: free_ports(n)?,
            processes: (0..n).map(|_| Mutex::new(None)).collect(),
        };
        for i in 0..n {
            first_start(
                &format!("fencelock serve #{i}"),
                &mut replicas,
                |r| &mut r.ports[i],
                |r| r.start_again(i),
            )?;
        }
        Ok(replicas)
    }

    fn process(&self, i: usize) -> MutexGuard<'_, Option<ChildProcess>> {
        self.processes[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many replicas there are (running or not).
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Replica `i`'s port.
    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// `http://127.0.0.1:PORT` of replica `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// One `http://` URL naming every replica, for a client that fails
    /// over by itself.
    pub fn url_of_all(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("http://{}", hosts.join(","))
    }

    /// Whether replica `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.process(i)
            .as_mut()
            .is_some_and(|p| p.is_running().unwrap_or(false))
    }

    /// kill -9 of replica `i`.
    pub fn kill(&self, i: usize) -> TestResult {
        if let Some(mut p) = self.process(i).take() {
            p.kill()?;
        }
        Ok(())
    }

    /// SIGSTOP of replica `i`: a hung replica, whose kernel still accepts
    /// connections and takes requests that nothing answers.
    pub fn pause(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGSTOP)
    }

    /// SIGCONT of replica `i`, paused by [`ServeReplicas::pause`].
    pub fn resume(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGCONT)
    }

    fn signal(&self, i: usize, signal: Signal) -> TestResult {
        match self.process(i).as_ref() {
            Some(p) => p.signal(signal),
            None => Err(format!("replica {i} is not running").into()),
        }
    }

    /// Starts replica `i` (again) on its port; returns once it listens.
    pub fn start_again(&self, i: usize) -> TestResult {
        let mut slot = self.process(i);
        if slot
            .as_mut()
            .is_some_and(|p| p.is_running().unwrap_or(false))
        {
            return Err(format!("replica {i} is still running").into());
        }
        let mut child = Command::new(&self.binary)
            .env_remove("FENCELOCK_URL")
            .env_remove("RUST_LOG")
            .args(["--url", &self.backend, "serve", "--listen"])
            .arg(format!("127.0.0.1:{}", self.ports[i]))
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut process = ChildProcess::new(format!("fencelock serve #{i}"), child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.is_empty() {
            // End of output: the replica exited (its error went to stderr).
            return Err(ExitedAtStart(format!(
                "replica {i} exited before listening on 127.0.0.1:{}",
                self.ports[i]
            ))
            .into());
        }
        if !line.starts_with("listening on ") {
            process.kill()?;
            return Err(format!("replica {i} did not start: {line:?}").into());
        }
        *slot = Some(process);
        Ok(())
    }
}

/// The configuration operators are given (`deploy/haproxy.cfg`), which the
/// tests therefore run: its settings, with the balancer bound to `port` on
/// loopback and one server line per replica port (each with the options of
/// the file's first server line).
const SHIPPED: &str = include_str!("../../../../deploy/haproxy.cfg");

/// [`SHIPPED`] for a balancer on `127.0.0.1:port` in front of `ports`.
fn config_for(port: u16, ports: &[u16]) -> TestResult<String> {
    let server = |line: &&str| line.trim_start().starts_with("server ");
    // `server NAME ADDRESS OPTIONS…`
    let options = SHIPPED
        .lines()
        .find(server)
        .map(|line| {
            line.split_whitespace()
                .skip(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|options| !options.is_empty())
        .ok_or("deploy/haproxy.cfg has no server line with options")?;
    let mut config = String::new();
    for line in SHIPPED.lines().filter(|l| !server(l)) {
        if line.trim_start().starts_with("bind ") {
            config.push_str(&format!("    bind 127.0.0.1:{port}\n"));
        } else {
            config.push_str(line);
            config.push('\n');
        }
    }
    for (i, p) in ports.iter().enumerate() {
        config.push_str(&format!("    server r{i} 127.0.0.1:{p} {options}\n"));
    }
    Ok(config)
}

/// HAProxy balancing HTTP requests over some servers with health checks on
/// `/healthz`, so that a dead replica is taken out within a fraction of a
/// second and requests refused by it are sent to another.
#[derive(Debug)]
pub struct Haproxy {
    _process: ChildProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts `haproxy` in front of `127.0.0.1:PORT` for each of `ports`.
    pub fn start(ports: &[u16]) -> TestResult<Self> {
        let binary = find_binary("haproxy", &["/usr/sbin"], "haproxy")?;
        let dir = tempfile::tempdir()?;
        let mut port = free_port()?;
        let process = first_start(
            "haproxy",
            &mut port,
            |port| port,
            |port| Self::spawn(&binary, dir.path(), *port, ports),
        )?;
        Ok(Self {
            _process: process,
            port,
            _dir: dir,
        })
    }

    /// Runs `haproxy` on `port` with its configuration in `dir`; returns
    /// once it accepts connections.
    fn spawn(binary: &Path, dir: &Path, port: u16, ports: &[u16]) -> TestResult<ChildProcess> {
        let config = config_for(port, ports)?;
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config)?;
        let child = Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut process = ChildProcess::new("haproxy", child);
        wait_for_port(
            ([127, 0, 0, 1], port).into(),
            Duration::from_secs(10),
            || process.running_pid(),
        )?;
        Ok(process)
    }

    /// `http://127.0.0.1:PORT` of the balancer.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{check_moves_off_a_taken_port, Taken},
        *,
    };

    /// HAProxy that cannot bind its port exits; its first start moves to a
    /// fresh port instead of failing, also when another process listens on
    /// the port (its listener is told from HAProxy's).
    /// The shipped file, bound to loopback, with the given replicas and the
    /// file's check options; nothing of its example addresses left.
    #[test]
    fn the_shipped_configuration_is_what_the_tests_run() -> TestResult {
        let config = config_for(4242, &[5001, 5002])?;
        assert!(config.contains("    bind 127.0.0.1:4242\n"), "{config}");
        assert!(
            config.contains("    server r0 127.0.0.1:5001 check inter 300ms fall 2 rise 1\n"),
            "{config}"
        );
        assert!(
            config.contains("    server r1 127.0.0.1:5002 check"),
            "{config}"
        );
        assert!(!config.contains("10.0.0."), "{config}");
        assert!(config.contains("option httpchk GET /healthz"), "{config}");
        Ok(())
    }

    #[test]
    fn haproxy_on_a_taken_port_moves_to_a_free_one() -> TestResult {
        let binary = find_binary("haproxy", &["/usr/sbin"], "haproxy")?;
        let dir = tempfile::tempdir()?;
        for how in [Taken::ByConnection, Taken::ByListener] {
            let mut port = 0;
            let _process = check_moves_off_a_taken_port(
                how,
                "haproxy",
                &mut port,
                |port| port,
                |port| Haproxy::spawn(&binary, dir.path(), *port, &[]),
            )?;
        }
        Ok(())
    }
}
