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
    sync::Arc,
    time::Duration,
};

use super::{
    find_binary,
    members::{direct, Engine, MemberSet, PeerLink, SingleServer, Slot},
};
use crate::{
    proxy::{Greeting, GreetingRewrite},
    TestResult,
};

/// The first word of a member's election greeting, by protocol version
/// (`QuorumCnxManager`: one address, or several joined by `|`).
const ELECTION_PROTOCOLS: [i64; 2] = [-65536, -65535];

/// The longest address list a greeting may carry here; ZooKeeper's own
/// bound is larger, but a longer one is no member of a test ensemble.
const MAX_GREETING_ADDRESSES: usize = 4096;

/// A greeting rewriter for the links between members
/// ([`crate::proxy::ProxyControls::set_greeting`]): a member that dials
/// another's election port names its own election address in its first
/// message, and a member with a higher id hangs up and dials that address
/// back, past any link. The rewriter names `dial_back(address)` instead,
/// where the member dialled reaches the one dialling (its link back);
/// addresses it does not know, and every other connection, pass as they
/// are.
pub fn election_greeting(
    dial_back: impl Fn(SocketAddr) -> Option<SocketAddr> + Send + Sync + 'static,
) -> Greeting {
    Arc::new(move |sent: &[u8]| {
        let word = |at: usize, len: usize| sent.get(at..at + len);
        let Some(version) = word(0, 8) else {
            return GreetingRewrite::NeedMore;
        };
        let version = i64::from_be_bytes(version.try_into().unwrap_or_default());
        if !ELECTION_PROTOCOLS.contains(&version) {
            return GreetingRewrite::Keep;
        }
        let Some(len) = word(16, 4) else {
            return GreetingRewrite::NeedMore;
        };
        let len = u32::from_be_bytes(len.try_into().unwrap_or_default());
        let Some(len) = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_GREETING_ADDRESSES)
        else {
            return GreetingRewrite::Keep;
        };
        let Some(named) = word(20, len) else {
            return GreetingRewrite::NeedMore;
        };
        let Ok(named) = std::str::from_utf8(named) else {
            return GreetingRewrite::Keep;
        };
        let mut known = false;
        let mut through = Vec::new();
        for addr in named.split('|') {
            match addr.parse().ok().and_then(&dial_back) {
                Some(link) => {
                    known = true;
                    through.push(link.to_string());
                }
                None => through.push(addr.to_owned()),
            }
        }
        if !known {
            return GreetingRewrite::Keep;
        }
        let through = through.join("|");
        let Ok(through_len) = u32::try_from(through.len()) else {
            return GreetingRewrite::Keep;
        };
        let mut with = sent[..16].to_vec();
        with.extend_from_slice(&through_len.to_be_bytes());
        with.extend_from_slice(through.as_bytes());
        GreetingRewrite::Replace {
            consumed: 20 + len,
            with,
        }
    })
}

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
    /// How many client connections member `i` has, its `srvr` answer's
    /// own included; `None` while it does not serve (it then names none).
    pub fn connections(&self, i: usize) -> TestResult<Option<u32>> {
        match srvr(self.slot(i).addr(), "Connections: ")? {
            Some(count) => Ok(Some(count.parse()?)),
            None => Ok(None),
        }
    }

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
    srvr(addr, "Mode: ")
}

/// The value of the line of `srvr`'s answer that starts with `field`.
fn srvr(addr: SocketAddr, field: &str) -> TestResult<Option<String>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"srvr")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    Ok(response
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|m| m.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting(version: i64, sid: i64, named: &str) -> Vec<u8> {
        let mut g = version.to_be_bytes().to_vec();
        g.extend_from_slice(&sid.to_be_bytes());
        g.extend_from_slice(&u32::try_from(named.len()).unwrap().to_be_bytes());
        g.extend_from_slice(named.as_bytes());
        g
    }

    #[test]
    fn an_election_greeting_names_the_link_back() {
        let own: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        let link: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        let rewrite = election_greeting(move |a| (a == own).then_some(link));
        for version in ELECTION_PROTOCOLS {
            let mut sent = greeting(version, 2, "127.0.0.1:4001");
            sent.extend_from_slice(b"notification");
            // Every prefix short of the address asks for more.
            for cut in [0, 7, 8, 19, 20, 33] {
                assert_eq!(rewrite(&sent[..cut]), GreetingRewrite::NeedMore, "{cut}");
            }
            let expected = greeting(version, 2, "127.0.0.1:5001");
            assert_eq!(
                rewrite(&sent),
                GreetingRewrite::Replace {
                    consumed: 34,
                    with: expected
                }
            );
        }
        // Several addresses: the known one is replaced, the others kept.
        let sent = greeting(-65535, 2, "127.0.0.1:4001|10.0.0.9:4001");
        let GreetingRewrite::Replace { with, .. } = rewrite(&sent) else {
            panic!("not rewritten");
        };
        assert_eq!(with, greeting(-65535, 2, "127.0.0.1:5001|10.0.0.9:4001"));
    }

    #[test]
    fn anything_else_passes_as_it_is() {
        let rewrite = election_greeting(|_| None);
        // Unknown address; a quorum packet (its first word is a type);
        // an address that is no text.
        assert_eq!(
            rewrite(&greeting(-65536, 2, "127.0.0.1:4001")),
            GreetingRewrite::Keep
        );
        assert_eq!(
            rewrite(&[0, 0, 0, 11, 0, 0, 0, 0, 9]),
            GreetingRewrite::Keep
        );
        let mut bad = greeting(-65536, 2, "");
        bad[16..20].copy_from_slice(&2u32.to_be_bytes());
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(rewrite(&bad), GreetingRewrite::Keep);
        let mut huge = greeting(-65536, 2, "");
        huge[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(rewrite(&huge), GreetingRewrite::Keep);
    }
}
