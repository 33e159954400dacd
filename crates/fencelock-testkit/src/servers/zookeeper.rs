//! Throwaway ZooKeeper servers: one standalone server, or an ensemble of
//! several on loopback, each member killable, pausable and restartable on
//! its ports.
//!
//! Servers run `QuorumPeerMain` from the Debian `zookeeper` package's jars
//! (`/usr/share/java`), with a configuration file written here: the admin
//! HTTP server off (it would take port 8080) and the `srvr` four-letter
//! command on, to tell when a member serves and which one leads.

use std::{
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use super::{find_binary, free_port, wait_for_port, ChildProcess};
use crate::TestResult;

/// How long a member gets to accept connections, and an ensemble to elect
/// a leader, after starting (a JVM start takes a few seconds).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the Debian package puts the server's jars and configuration.
const JARS: &str = "/usr/share/java";
const CONF: &str = "/etc/zookeeper/conf";

#[derive(Debug)]
struct Member {
    id: usize,
    client_port: u16,
    dir: PathBuf,
    process: Mutex<Option<ChildProcess>>,
}

impl Member {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }
}

/// A ZooKeeper ensemble of one (standalone) or more members on loopback
/// with temporary data directories, killed on drop.
#[derive(Debug)]
pub struct ZkServer {
    java: PathBuf,
    members: Vec<Member>,
    _root: tempfile::TempDir,
}

impl ZkServer {
    /// A standalone server.
    pub fn start() -> TestResult<Self> {
        Self::start_members(1)
    }

    /// An ensemble of `n` members, started together; returns once every
    /// member serves (a leader is elected).
    pub fn start_members(n: usize) -> TestResult<Self> {
        let java = find_binary("java", &[], "default-jre-headless")?;
        if !Path::new(JARS).join("zookeeper.jar").is_file() {
            return Err(format!(
                "{JARS}/zookeeper.jar was not found; install the `zookeeper` package"
            )
            .into());
        }
        let root = tempfile::tempdir()?;
        let mut peers = Vec::with_capacity(n);
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let id = i + 1;
            let dir = root.path().join(format!("m{id}"));
            std::fs::create_dir_all(dir.join("data"))?;
            peers.push(format!(
                "server.{id}=127.0.0.1:{}:{}",
                free_port()?,
                free_port()?
            ));
            members.push(Member {
                id,
                client_port: free_port()?,
                dir,
                process: Mutex::new(None),
            });
        }
        for m in &members {
            let mut config = format!(
                "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
                 clientPort={}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=srvr\n",
                m.dir.join("data").display(),
                m.client_port
            );
            if n > 1 {
                config.push_str(&peers.join("\n"));
                config.push('\n');
                std::fs::write(m.dir.join("data/myid"), format!("{}\n", m.id))?;
            }
            std::fs::write(m.dir.join("zoo.cfg"), config)?;
        }
        let server = Self {
            java,
            members,
            _root: root,
        };
        for i in 0..n {
            server.spawn(i)?;
        }
        for i in 0..n {
            server.wait_serving(i)?;
        }
        Ok(server)
    }

    fn spawn(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        let log = File::create(m.dir.join("zookeeper.log"))?;
        let child = Command::new(&self.java)
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-cp"])
            .arg(format!("{JARS}/*:{CONF}"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(m.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        *m.lock() = Some(ChildProcess::new(format!("zookeeper {}", m.id), child));
        Ok(())
    }

    fn wait_serving(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        wait_for_port(m.addr(), START_TIMEOUT, || {
            m.lock().as_mut().map_or(Ok(false), |p| p.is_running())
        })?;
        // An open port is not a quorum: poll `srvr` until it names a mode.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if mode(m.addr()).is_ok_and(|mode| mode.is_some()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(
                    format!("zookeeper {} did not serve within {START_TIMEOUT:?}", m.id).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ensemble has no members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `127.0.0.1:PORT` of member `i`'s client port.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// `zk://` URL naming every member.
    pub fn url(&self) -> String {
        let all: Vec<String> = (0..self.members.len()).map(|i| self.endpoint(i)).collect();
        format!("zk://{}", all.join(","))
    }

    /// SIGKILL member `i`.
    pub fn kill(&self, i: usize) -> TestResult {
        if let Some(mut p) = self.members[i].lock().take() {
            p.kill()?;
        }
        Ok(())
    }

    /// SIGSTOP member `i` (a stalled server: connections stay open, nothing
    /// answers).
    pub fn pause(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGSTOP)
    }

    /// SIGCONT member `i`.
    pub fn resume(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGCONT)
    }

    fn signal(&self, i: usize, signal: Signal) -> TestResult {
        match self.members[i].lock().as_ref() {
            Some(p) => p.signal(signal),
            None => Err(format!("zookeeper {} is not running", self.members[i].id).into()),
        }
    }

    /// Starts member `i` again on its ports and data directory; returns once
    /// it accepts connections (not necessarily serving: its peers may be
    /// down).
    pub fn start_again(&self, i: usize) -> TestResult {
        if self.is_running(i) {
            return Err(format!("zookeeper {} is still running", self.members[i].id).into());
        }
        self.spawn(i)?;
        let m = &self.members[i];
        wait_for_port(m.addr(), START_TIMEOUT, || {
            m.lock().as_mut().map_or(Ok(false), |p| p.is_running())
        })
    }

    /// The member that leads now (or the standalone server), asking the
    /// running members in turn; `None` while there is none.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            self.is_running(i)
                && mode(self.members[i].addr())
                    .is_ok_and(|m| matches!(m.as_deref(), Some("leader" | "standalone")))
        })
    }

    /// Whether member `i` is running (not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].lock().is_some()
    }

    /// Stops every member cleanly (SIGTERM), starts them again, and waits
    /// until each serves.
    pub fn restart(&self) -> TestResult {
        for m in &self.members {
            if let Some(mut p) = m.lock().take() {
                p.terminate(Duration::from_secs(10))?;
            }
        }
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        for i in 0..self.members.len() {
            self.wait_serving(i)?;
        }
        Ok(())
    }
}

/// The `Mode:` line of the `srvr` command (`standalone`, `leader`,
/// `follower`), or `None` while the member does not serve requests.
fn mode(addr: SocketAddr) -> TestResult<Option<String>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"srvr")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    Ok(response
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned()))
}

impl super::url_factory::UrlServer for ZkServer {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        Self::start()
    }
    fn url(&self) -> String {
        ZkServer::url(self)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
}
