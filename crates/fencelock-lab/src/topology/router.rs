//! etcd's peer links, one per pair of members.
//!
//! An etcd member advertises one peer URL to all its peers, so a proxy in
//! front of that URL cannot tell which peer a connection comes from; a
//! delay per pair of sites, or a partition that cuts one site off, needs
//! to. Every raft stream and message a member opens names the sender: its
//! request head carries the sender's own advertised URL (`X-PeerURLs`). The
//! router stands at a member's advertised URL, reads the head of each
//! connection, and sends the connection on through the link of that pair.
//! A connection that names no sender (etcd's round-trip probes) takes the
//! member's own link.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The longest request head a router reads, and how long it waits for it.
const HEAD_MAX: usize = 16 * 1024;
const HEAD_WAIT: Duration = Duration::from_secs(5);

/// Which member stands at which advertised peer port, for every router of
/// a cluster (filled as the routers start, read as connections come).
pub(crate) type Members = Arc<Mutex<HashMap<u16, usize>>>;

/// A router in front of one member (see the module docs); dropping it
/// stops its listener.
#[derive(Debug)]
pub(crate) struct Router {
    addr: SocketAddr,
    _stop: DropGuard,
}

impl Router {
    /// Starts a router on a free loopback port: a connection from member
    /// `m` goes on to `links[m]`, any other to `unnamed`. Registers its port
    /// in `members` as member `index`'s.
    pub(crate) async fn start(
        index: usize,
        members: Members,
        links: HashMap<usize, SocketAddr>,
        unnamed: SocketAddr,
    ) -> std::io::Result<Router> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr.port(), index);
        let stop = CancellationToken::new();
        let routes = Arc::new(Routes {
            members,
            links,
            unnamed,
        });
        tokio::spawn(accept(listener, routes, stop.clone()));
        Ok(Router {
            addr,
            _stop: stop.drop_guard(),
        })
    }

    /// The address to advertise as the member's peer URL.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

struct Routes {
    members: Members,
    links: HashMap<usize, SocketAddr>,
    unnamed: SocketAddr,
}

impl Routes {
    /// Where a connection whose request head is `head` goes.
    fn route(&self, head: &[u8]) -> SocketAddr {
        sender_port(head)
            .and_then(|port| {
                self.members
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&port)
                    .copied()
            })
            .and_then(|from| self.links.get(&from).copied())
            .unwrap_or(self.unnamed)
    }
}

async fn accept(listener: TcpListener, routes: Arc<Routes>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else {
            // Out of descriptors and the like: the peer dials again.
            continue;
        };
        let (routes, stop) = (Arc::clone(&routes), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = forward(client, &routes) => {}
            }
        });
    }
}

/// Reads the head of `client`'s first request, connects to its route and
/// carries the connection both ways until either side closes it.
async fn forward(mut client: TcpStream, routes: &Routes) {
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(HEAD_WAIT, async {
        let mut chunk = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX {
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        true
    })
    .await;
    if !matches!(read, Ok(true)) {
        return;
    }
    let Ok(mut upstream) = TcpStream::connect(routes.route(&head)).await else {
        return;
    };
    // As the fault proxy does: no Nagle delay the two ends did not ask for.
    for stream in [&client, &upstream] {
        let _ = stream.set_nodelay(true);
    }
    if upstream.write_all(&head).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// The port of the first URL in the request head's `X-PeerURLs` header.
fn sender_port(head: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(head).ok()?;
    let value = text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-peerurls")
            .then(|| value.trim())
    })?;
    let first = value.split(',').next()?.trim();
    let authority = first.split_once("://").map_or(first, |(_, rest)| rest);
    let authority = authority.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_is_the_first_url_of_its_header() {
        let head = b"GET /raft/stream/message/32c0 HTTP/1.1\r\nHost: 127.0.0.1:23801\r\n\
                     X-Peerurls: http://127.0.0.1:23810,http://10.0.0.1:2380\r\n\
                     X-Server-From: 32c014c82650666f\r\n\r\n";
        assert_eq!(sender_port(head), Some(23810));
        let probe = b"GET /raft/probing HTTP/1.1\r\nHost: 127.0.0.1:23801\r\n\r\n";
        assert_eq!(sender_port(probe), None);
        assert_eq!(sender_port(b"X-PeerURLs: nonsense\r\n\r\n"), None);
        assert_eq!(sender_port(b"\xff\xfe\r\n\r\n"), None);
    }
}
