//! Throwaway `etcd` servers: one member, or a cluster of several on
//! loopback, each member killable and restartable on its ports.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use super::{
    find_binary,
    members::{direct, Engine, MemberSet, PeerLink, SingleServer, Slot},
};
use crate::TestResult;

/// An etcd cluster of one or more members on loopback with temporary data
/// directories, killed on drop.
pub type EtcdCluster = MemberSet<Etcd>;

/// How etcd members are run: one binary, a shared peer list.
#[derive(Debug)]
pub struct Etcd {
    binary: PathBuf,
    initial_cluster: String,
    /// Each member's peer URL as its peers dial it: its listener, or a
    /// link in front of it.
    advertised: Vec<String>,
    /// The same for every member (a member with another token would form a
    /// cluster of its own), different between clusters.
    cluster_token: String,
}

impl Engine for Etcd {
    const NAME: &'static str = "etcd";
    const SCHEME: &'static str = "etcd";
    const START_TIMEOUT: Duration = Duration::from_secs(30);
    const PEER_PORTS: usize = 1;

    fn command(&self, slot: &Slot) -> Command {
        let client = format!("http://{}", slot.addr());
        let peer = format!("http://{}", peer_addr(slot));
        let mut command = Command::new(&self.binary);
        command
            .arg("--name")
            .arg(member_name(slot.index))
            .arg("--data-dir")
            .arg(slot.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args([
                "--initial-advertise-peer-urls",
                &self.advertised[slot.index],
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.cluster_token]);
        command
    }

    fn serves(&self, slot: &Slot) -> bool {
        health(slot.addr()).unwrap_or(false)
    }

    fn leads(&self, slot: &Slot) -> bool {
        is_leader(slot.addr()).unwrap_or(false)
    }
}

impl SingleServer for Etcd {
    fn start_single() -> TestResult<EtcdCluster> {
        EtcdCluster::start()
    }
}

fn member_name(index: usize) -> String {
    format!("m{index}")
}

/// The member's peer listener, on its one peer port.
fn peer_addr(slot: &Slot) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], slot.peer_ports[0]))
}

impl MemberSet<Etcd> {
    /// A single-member cluster.
    pub fn start() -> TestResult<Self> {
        Self::start_members(1)
    }

    /// A cluster of `n` members, started together; returns once every
    /// member reports healthy (a leader is elected).
    pub fn start_members(n: usize) -> TestResult<Self> {
        Self::start_linked(n, &direct)
    }

    /// A cluster of `n` members whose peers reach each other through
    /// `link`. A member advertises one peer URL to all its peers, so `link`
    /// is asked once per member, with no dialling member: every peer's
    /// traffic to a member takes the one link in front of it.
    pub fn start_linked(n: usize, link: &PeerLink<'_>) -> TestResult<Self> {
        let binary = find_binary("etcd", &[], "etcd-server")?;
        Self::start_with(n, |slots| {
            let advertised = slots
                .iter()
                .map(|s| Ok(format!("http://{}", link(None, s.index, peer_addr(s))?)))
                .collect::<TestResult<Vec<_>>>()?;
            let initial_cluster = slots
                .iter()
                .zip(&advertised)
                .map(|(s, url)| format!("{}={url}", member_name(s.index)))
                .collect::<Vec<_>>()
                .join(",");
            let cluster_token = format!("fencelock-{}", slots[0].client_port);
            Ok(Etcd {
                binary: binary.clone(),
                initial_cluster,
                advertised,
                cluster_token,
            })
        })
    }

    /// How many client requests of gRPC method `method` (`Txn`, `Range`,
    /// `LeaseGrant`, …) member `i` has handled, from its `/metrics`: which
    /// member a client's requests reached.
    pub fn handled(&self, i: usize, method: &str) -> TestResult<u64> {
        let response = http(self.slot(i).addr(), "GET /metrics HTTP/1.0\r\n\r\n")?;
        let wanted = format!("grpc_method=\"{method}\"");
        let mut total = 0.0;
        for line in response.lines() {
            if line.starts_with("grpc_server_handled_total{") && line.contains(&wanted) {
                let value = line.rsplit(' ').next().unwrap_or_default();
                total += value
                    .parse::<f64>()
                    .map_err(|e| format!("a metric line of {:?}: {e}", line))?;
            }
        }
        // A count of requests: a whole number, far below 2^53.
        Ok(total as u64)
    }

    /// Deletes `key` (the raw etcd key, e.g. `PREFIX/locks/K`) behind
    /// fencelock's back, as `etcdctl del` would: through the HTTP gateway of
    /// a running member, so callers need no etcd client. Returns how many
    /// keys were deleted.
    pub fn delete_key(&self, key: &str) -> TestResult<u64> {
        let i = (0..self.len())
            .find(|&i| self.is_running(i))
            .ok_or("no etcd member is running")?;
        let body = serde_json::json!({ "key": base64(key.as_bytes()) }).to_string();
        let response = http(
            self.slot(i).addr(),
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
