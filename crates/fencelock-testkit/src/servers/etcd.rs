//! Throwaway `etcd` servers: one member, or a cluster of several on
//! loopback, each member killable and restartable on its ports.

use std::{
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::{find_binary, free_port, wait_for_port, ChildProcess};
use crate::TestResult;

/// How long a member gets to accept connections, and a cluster to elect a
/// leader, after starting.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    process: Mutex<Option<ChildProcess>>,
}

impl Member {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An etcd cluster of one or more members on loopback with temporary data
/// directories, killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    binary: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    /// The same for every member (a member with another token would form a
    /// cluster of its own), different between clusters.
    cluster_token: String,
    _root: tempfile::TempDir,
}

impl EtcdCluster {
    /// A single-member cluster.
    pub fn start() -> TestResult<Self> {
        Self::start_members(1)
    }

    /// A cluster of `n` members, started together; returns once every
    /// member reports healthy (a leader is elected).
    pub fn start_members(n: usize) -> TestResult<Self> {
        let binary = find_binary("etcd", &[], "etcd-server")?;
        let root = tempfile::tempdir()?;
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let dir = root.path().join(format!("m{i}"));
            std::fs::create_dir_all(&dir)?;
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                dir,
                process: Mutex::new(None),
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_token = format!("fencelock-{}", members[0].peer_port);
        let cluster = Self {
            binary,
            members,
            initial_cluster,
            cluster_token,
            _root: root,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_ready(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = File::create(m.dir.join("etcd.log"))?;
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(m.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.cluster_token])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        *m.lock() = Some(ChildProcess::new(format!("etcd {}", m.name), child));
        Ok(())
    }

    fn wait_ready(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        let addr = SocketAddr::from(([127, 0, 0, 1], m.client_port));
        wait_for_port(addr, START_TIMEOUT, || {
            m.lock().as_mut().map_or(Ok(false), |p| p.is_running())
        })?;
        // An open port is not a leader: poll /health until it says so.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if health(addr).unwrap_or(false) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(
                    format!("etcd {} was not healthy within {START_TIMEOUT:?}", m.name).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `127.0.0.1:PORT` of member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// `etcd://` URL naming every member.
    pub fn url(&self) -> String {
        let all: Vec<String> = (0..self.members.len()).map(|i| self.endpoint(i)).collect();
        format!("etcd://{}", all.join(","))
    }

    /// SIGKILL member `i`.
    pub fn kill(&self, i: usize) -> TestResult {
        if let Some(mut p) = self.members[i].lock().take() {
            p.kill()?;
        }
        Ok(())
    }

    /// Starts member `i` again on its ports and data directory; returns once
    /// it accepts connections (not necessarily healthy: its peers may be down).
    pub fn start_again(&self, i: usize) -> TestResult {
        if self.members[i].lock().is_some() {
            return Err(format!("etcd {} is still running", self.members[i].name).into());
        }
        self.spawn(i)?;
        let m = &self.members[i];
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], m.client_port)),
            START_TIMEOUT,
            || m.lock().as_mut().map_or(Ok(false), |p| p.is_running()),
        )
    }

    /// The member that is the leader now, asking the running members in
    /// turn; `None` while there is none (an election, or a majority down).
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            self.members[i].lock().is_some()
                && is_leader(SocketAddr::from((
                    [127, 0, 0, 1],
                    self.members[i].client_port,
                )))
                .unwrap_or(false)
        })
    }

    /// Deletes `key` (the raw etcd key, e.g. `PREFIX/locks/K`) behind
    /// fencelock's back, as `etcdctl del` would: through the HTTP gateway of
    /// a running member, so callers need no etcd client. Returns how many
    /// keys were deleted.
    pub fn delete_key(&self, key: &str) -> TestResult<u64> {
        let i = (0..self.members.len())
            .find(|&i| self.is_running(i))
            .ok_or("no etcd member is running")?;
        let body = serde_json::json!({ "key": base64(key.as_bytes()) }).to_string();
        let response = http(
            SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port)),
            &format!(
                "POST /v3/kv/deleterange HTTP/1.0\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )?;
        let json = response
            .split_once("\r\n\r\n")
            .map(|(_, json)| json)
            .ok_or("no body in the deleterange response")?;
        let answer: serde_json::Value = serde_json::from_str(json)?;
        if answer.get("error").is_some() {
            return Err(format!("deleterange failed: {json}").into());
        }
        // int64 fields come as decimal strings, and a zero is left out.
        Ok(answer["deleted"]
            .as_str()
            .map_or(Ok(0), str::parse)
            .map_err(|e| format!("deleterange answered {json}: {e}"))?)
    }

    /// Whether member `i` is running (not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].lock().is_some()
    }

    /// Stops every member cleanly (SIGTERM), starts them again, and waits
    /// until each is healthy.
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
            self.wait_ready(i)?;
        }
        Ok(())
    }
}

/// One plain HTTP/1.0 request to a member's client port; the whole
/// response, headers included.
fn http(addr: SocketAddr, request: &str) -> TestResult<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(request.as_bytes())?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    Ok(response)
}

/// Standard base64 with padding: the HTTP gateway's encoding of bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `GET /health`: true when the member has a leader.
fn health(addr: SocketAddr) -> TestResult<bool> {
    let response = http(addr, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    Ok(response.contains("\"health\":\"true\""))
}

/// The maintenance status through the gRPC gateway: whether this member
/// is the leader it knows of.
fn is_leader(addr: SocketAddr) -> TestResult<bool> {
    let body = "{}";
    let response = http(
        addr,
        &format!(
            "POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )?;
    let json = response
        .split_once("\r\n\r\n")
        .map(|(_, json)| json)
        .ok_or("no body in the status response")?;
    let status: serde_json::Value = serde_json::from_str(json)?;
    // uint64 fields come as decimal strings; a member without a leader
    // reports none (or "0").
    let member = status["header"]["member_id"].as_str();
    let leader = status["leader"].as_str().filter(|l| *l != "0");
    Ok(member.is_some() && member == leader)
}

impl super::url_factory::UrlServer for EtcdCluster {
    fn start_shared() -> TestResult<Self> {
        Self::start()
    }
    fn start_dedicated() -> TestResult<Self> {
        Self::start()
    }
    fn url(&self) -> String {
        EtcdCluster::url(self)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_the_standard_encoding_with_padding() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("fencelock/locks/K", "ZmVuY2Vsb2NrL2xvY2tzL0s="),
        ] {
            assert_eq!(super::base64(plain.as_bytes()), encoded);
        }
    }
}
