//! Throwaway ZooKeeper servers: one standalone server, or an ensemble of
//! several on loopback, each member killable, pausable and restartable on
//! its ports.
//!
//! Servers run `QuorumPeerMain` from the Debian `zookeeper` package's jars
//! (`/usr/share/java`), with a configuration file written here: the admin
//! HTTP server off (it would take port 8080) and the `srvr` four-letter
//! command on, to tell when a member serves and which one leads.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{
    find_binary,
    members::{direct, Engine, MemberSet, PeerLink, SingleServer, Slot},
};
use crate::TestResult;

/// Where the Debian package puts the server's jars and configuration.
const JARS: &str = "/usr/share/java";
const CONF: &str = "/etc/zookeeper/conf";

/// A ZooKeeper ensemble of one (standalone) or more members on loopback
/// with temporary data directories, killed on drop.
pub type ZkServer = MemberSet<ZooKeeper>;

/// How ZooKeeper members are run: the package's jars on a JRE, each member
/// with its own `zoo.cfg` (written when the set is laid out).
#[derive(Debug)]
pub struct ZooKeeper {
    java: PathBuf,
}

impl Engine for ZooKeeper {
    const NAME: &'static str = "zookeeper";
    const SCHEME: &'static str = "zk";
    /// A JVM start takes a few seconds.
    const START_TIMEOUT: Duration = Duration::from_secs(60);
    /// The quorum and the leader-election ports.
    const PEER_PORTS: usize = 2;

    fn command(&self, slot: &Slot) -> Command {
        let mut command = Command::new(&self.java);
        command
            .args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                // Time-stamped, for reading beside a test's own log.
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
                "-cp",
            ])
            // The jar directory holds six SLF4J bindings, and the one the
            // class path lists first wins: `slf4j-nop` logged nothing.
            // `slf4j-simple` first writes the member's log to its stderr,
            // the log file in its directory.
            .arg(format!("{JARS}/slf4j-simple.jar:{JARS}/*:{CONF}"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(slot.dir.join("zoo.cfg"));
        command
    }

    fn serves(&self, slot: &Slot) -> bool {
        mode(slot.addr()).is_ok_and(|mode| mode.is_some())
    }

    fn leads(&self, slot: &Slot) -> bool {
        mode(slot.addr()).is_ok_and(|m| matches!(m.as_deref(), Some("leader" | "standalone")))
    }

    /// The transaction logs and snapshots (`data/version-2`); the `myid`
    /// beside them stays, or the member would not know which server it is.
    fn wipe(&self, slot: &Slot) -> TestResult {
        let logs = slot.dir.join("data/version-2");
        if logs.exists() {
            std::fs::remove_dir_all(logs)?;
        }
        Ok(())
    }
}

impl SingleServer for ZooKeeper {
    fn start_single() -> TestResult<ZkServer> {
        ZkServer::start()
    }
}

impl MemberSet<ZooKeeper> {
    /// A standalone server.
    pub fn start() -> TestResult<Self> {
        Self::start_members(1)
    }

    /// An ensemble of `n` members, started together; returns once every
    /// member serves (a leader is elected).
    pub fn start_members(n: usize) -> TestResult<Self> {
        Self::start_linked(n, &direct)
    }

    /// An ensemble of `n` members whose peers reach each other through
    /// `link`, asked for every member and peer: each member's own
    /// configuration names where it dials the others (ZooKeeper does not
    /// require the members' server lists to agree on addresses, only on
    /// ids).
    pub fn start_linked(n: usize, link: &PeerLink<'_>) -> TestResult<Self> {
        let java = find_binary("java", &[], "default-jre-headless")?;
        if !Path::new(JARS).join("zookeeper.jar").is_file() {
            return Err(format!(
                "{JARS}/zookeeper.jar was not found; install the `zookeeper` package"
            )
            .into());
        }
        Self::start_with(n, |slots| {
            for slot in slots {
                std::fs::create_dir_all(slot.dir.join("data"))?;
                let mut config = format!(
                    "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
                     clientPort={}\nclientPortAddress=127.0.0.1\n\
                     admin.enableServer=false\n4lw.commands.whitelist=srvr\n",
                    slot.dir.join("data").display(),
                    slot.client_port
                );
                if n > 1 {
                    for peer in slots {
                        // A member binds its own line's ports; it dials
                        // the others' through their links.
                        let port = |p: u16| -> TestResult<SocketAddr> {
                            let addr = SocketAddr::from(([127, 0, 0, 1], p));
                            if peer.index == slot.index {
                                Ok(addr)
                            } else {
                                link(Some(slot.index), peer.index, addr)
                            }
                        };
                        let (quorum, election) =
                            (port(peer.peer_ports[0])?, port(peer.peer_ports[1])?);
                        if quorum.ip() != election.ip() {
                            return Err(format!(
                                "a member's quorum and election ports take one host: \
                                 {quorum} and {election}"
                            )
                            .into());
                        }
                        config.push_str(&format!(
                            "server.{}={quorum}:{}\n",
                            peer.index + 1,
                            election.port()
                        ));
                    }
                    std::fs::write(slot.dir.join("data/myid"), format!("{}\n", slot.index + 1))?;
                }
                std::fs::write(slot.dir.join("zoo.cfg"), config)?;
            }
            Ok(ZooKeeper { java: java.clone() })
        })
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
