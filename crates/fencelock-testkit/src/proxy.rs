//! A TCP fault proxy for loopback tests: it sits between clients and a real
//! server and, while it runs, adds latency, stands in for lost packets,
//! swallows traffic (a partition), refuses new connections or resets
//! existing ones, per direction.
//!
//! ```no_run
//! # async fn demo() -> fencelock_testkit::TestResult {
//! use std::time::Duration;
//! use fencelock_testkit::proxy::{Direction, ProxiedUrl};
//!
//! // One proxy per endpoint the URL names; connect through `proxied.url()`.
//! let proxied = ProxiedUrl::start("redis://127.0.0.1:6379/0").await?;
//! proxied.set_latency(Direction::Both, Duration::from_millis(20), Duration::from_millis(5));
//! proxied.partition(); // nothing gets through any more
//! proxied.heal(); // connections that lost bytes are reset; new ones work
//! # Ok(()) }
//! ```
//!
//! Why a partition resets connections when it heals: TCP never loses bytes
//! silently. A real partition either ends before the peers notice (TCP
//! retransmits and the stream carries on) or lasts until a timeout kills the
//! connection. A proxy that dropped bytes and then carried on would hand the
//! client a corrupted protocol stream, which no network does, so a
//! connection that lost bytes is reset the moment the partition lifts, as if
//! TCP had given up on it.
//!
//! A connection closes as a whole when either side closes its half; no
//! database protocol fencelock speaks needs half-closed connections.
//!
//! A proxy can also rewrite the first message of each connection towards
//! the server ([`ProxyControls::set_greeting`]), where a protocol names an
//! address the other end dials back (a ZooKeeper member's election
//! greeting): a lab of links then keeps that dial on its link.

use std::{
    collections::HashMap,
    io,
    net::{SocketAddr, ToSocketAddrs},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use rand::Rng;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
    time::Instant,
};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::TestResult;

/// Which way the bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server: requests.
    ToServer,
    /// From the server to the client: replies.
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    fn covers(self, way: Way) -> bool {
        matches!(
            (self, way),
            (Direction::Both, _)
                | (Direction::ToServer, Way::ToServer)
                | (Direction::ToClient, Way::ToClient)
        )
    }
}

/// One concrete direction, as a pump sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    ToServer,
    ToClient,
}

/// The faults of one direction.
#[derive(Clone, Copy, Debug, Default)]
struct PathFaults {
    latency: Duration,
    jitter: Duration,
    /// The chance that a chunk is "lost", and what its resending costs
    /// ([`ProxyControls::set_loss`]).
    loss: f64,
    resend_after: Duration,
    blackhole: bool,
}

#[derive(Debug, Default)]
struct Faults {
    to_server: PathFaults,
    to_client: PathFaults,
    refuse: bool,
    /// How long a new connection waits for the server to accept
    /// ([`ProxyControls::set_upstream_patience`]); not a fault, so `heal`
    /// keeps it.
    upstream_patience: Duration,
}

impl Faults {
    fn path(&self, way: Way) -> PathFaults {
        match way {
            Way::ToServer => self.to_server,
            Way::ToClient => self.to_client,
        }
    }

    fn paths_mut(&mut self, direction: Direction) -> impl Iterator<Item = &mut PathFaults> {
        let (to_server, to_client) = (&mut self.to_server, &mut self.to_client);
        [
            direction.covers(Way::ToServer).then_some(to_server),
            direction.covers(Way::ToClient).then_some(to_client),
        ]
        .into_iter()
        .flatten()
    }
}

/// A live connection, as the controls see it.
#[derive(Debug)]
struct Connection {
    reset: CancellationToken,
    /// Set once the connection swallowed bytes: it is reset when the
    /// blackhole lifts.
    damaged: Arc<AtomicBool>,
}

/// What a [`Greeting`] rewriter makes of the bytes a connection sent the
/// server so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GreetingRewrite {
    /// The first message is not complete yet: read more.
    NeedMore,
    /// Send `with` instead of the first `consumed` bytes, the rest as it is.
    Replace {
        /// How many of the bytes read were the first message.
        consumed: usize,
        /// What goes to the server in their place.
        with: Vec<u8>,
    },
    /// Not a message to rewrite: the connection passes as it is.
    Keep,
}

/// Reads the start of what a connection sends the server, and says what
/// to do with it ([`ProxyControls::set_greeting`]).
pub type Greeting = Arc<dyn Fn(&[u8]) -> GreetingRewrite + Send + Sync>;

/// The most bytes held back while a [`Greeting`] asks for more: beyond
/// it, the connection passes as it is.
const MAX_GREETING: usize = 64 * 1024;

#[derive(Default)]
struct Shared {
    faults: Mutex<Faults>,
    greeting: Mutex<Option<Greeting>>,
    connections: Mutex<HashMap<u64, Connection>>,
    next_id: AtomicU64,
    swallowed: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("faults", &self.faults)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section is a plain read or assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Switches a running [`FaultProxy`]'s faults. Cheap to clone; every clone
/// controls the same proxy.
#[derive(Clone, Debug)]
pub struct ProxyControls {
    shared: Arc<Shared>,
}

impl ProxyControls {
    /// Rewrites the first message of each new connection towards the
    /// server with `greeting` (`None`: no more). Bytes are held back until
    /// it has decided (at most 64 KiB); delays and losses then apply to
    /// what it made of them.
    pub fn set_greeting(&self, greeting: Option<Greeting>) {
        *lock(&self.shared.greeting) = greeting;
    }

    /// Delays every chunk travelling in `direction` by `base` plus a uniform
    /// random extra of up to `jitter`. Chunks keep their order: a chunk is
    /// never delivered before the one read ahead of it.
    pub fn set_latency(&self, direction: Direction, base: Duration, jitter: Duration) {
        for path in lock(&self.shared.faults).paths_mut(direction) {
            path.latency = base;
            path.jitter = jitter;
        }
    }

    /// Stands in for packet loss in `direction`: each chunk is, with
    /// probability `loss` (0 to 1), delivered `resend_after` late, as TCP
    /// delivers a lost segment once it resends it (a retransmission
    /// time-out later: the round trip and at least 200 ms on Linux). Order
    /// is kept, so the chunks behind it wait too, as TCP's do. A stream
    /// proxy cannot lose a packet itself: what reaches it was already
    /// delivered in order by the kernel.
    pub fn set_loss(&self, direction: Direction, loss: f64, resend_after: Duration) {
        for path in lock(&self.shared.faults).paths_mut(direction) {
            path.loss = loss.clamp(0.0, 1.0);
            path.resend_after = resend_after;
        }
    }

    /// Swallows (`on`) or passes (`!on`) the bytes travelling in
    /// `direction`, on existing and new connections. Lifting a blackhole
    /// resets every connection that lost bytes (see the module docs).
    pub fn set_blackhole(&self, direction: Direction, on: bool) {
        for path in lock(&self.shared.faults).paths_mut(direction) {
            path.blackhole = on;
        }
        if !on {
            self.reset_where(|c| c.damaged.load(Ordering::SeqCst));
        }
    }

    /// A partition: swallows everything, both ways.
    pub fn partition(&self) {
        self.set_blackhole(Direction::Both, true);
    }

    /// While `on`, new connections are reset as soon as they are accepted
    /// (the client sees its connection reset, as from a closed port behind
    /// a firewall that rejects). Existing connections are untouched.
    pub fn set_refuse(&self, on: bool) {
        lock(&self.shared.faults).refuse = on;
    }

    /// How long a new connection waits for the server to start listening
    /// before the client's side is reset (default: not at all). A client
    /// dialling a port that is not open yet is refused and dials again; the
    /// proxy has already accepted it, so the client would see its
    /// connection reset instead, in the middle of its own protocol's
    /// handshake. Some clients give up on that where they retry a refusal:
    /// a ZooKeeper member following a leader that has just won an election
    /// and is about to open its quorum port returns to the election. With a
    /// patience the proxy dials again every 50 ms meanwhile, as the
    /// client's own retries would.
    pub fn set_upstream_patience(&self, patience: Duration) {
        lock(&self.shared.faults).upstream_patience = patience;
    }

    /// Resets every open connection now: both the client and the server see
    /// a TCP RST.
    pub fn reset_all(&self) {
        self.reset_where(|_| true);
    }

    /// Turns every fault off: no latency or loss, no blackhole (resetting damaged
    /// connections), new connections accepted.
    pub fn heal(&self) {
        {
            let mut faults = lock(&self.shared.faults);
            faults.refuse = false;
            for path in faults.paths_mut(Direction::Both) {
                path.latency = Duration::ZERO;
                path.jitter = Duration::ZERO;
                path.loss = 0.0;
            }
        }
        self.set_blackhole(Direction::Both, false);
    }

    /// How many client connections are open.
    pub fn connections(&self) -> usize {
        lock(&self.shared.connections).len()
    }

    /// How many bytes blackholes have swallowed so far, both ways.
    pub fn swallowed_bytes(&self) -> u64 {
        self.shared.swallowed.load(Ordering::SeqCst)
    }

    fn reset_where(&self, pick: impl Fn(&Connection) -> bool) {
        for connection in lock(&self.shared.connections).values() {
            if pick(connection) {
                connection.reset.cancel();
            }
        }
    }
}

/// A TCP proxy on a random loopback port, forwarding every connection to
/// one upstream address, with faults switched through [`ProxyControls`].
/// Dropping it stops the listener and resets every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    controls: ProxyControls,
    _stop: DropGuard,
}

impl FaultProxy {
    /// Starts a healthy proxy to `upstream` on `127.0.0.1:<random port>`.
    /// Must be called inside a tokio runtime, which runs its tasks.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            Arc::clone(&shared),
            stop.clone(),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            controls: ProxyControls { shared },
            _stop: stop.drop_guard(),
        })
    }

    /// Where clients connect instead of the upstream server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server this proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The switches of this proxy.
    pub fn controls(&self) -> ProxyControls {
        self.controls.clone()
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(e) => {
                    // Out of descriptors and the like: the next accept may
                    // work, and the test sees the failed connection.
                    tracing::warn!(error = %e, "fault proxy: accept failed");
                    continue;
                }
            },
        };
        if lock(&shared.faults).refuse {
            reset(client);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            reset: stop.child_token(),
            damaged: Arc::new(AtomicBool::new(false)),
        };
        let reset_token = connection.reset.clone();
        let damaged = Arc::clone(&connection.damaged);
        lock(&shared.connections).insert(id, connection);
        tokio::spawn(serve(
            client,
            upstream,
            Registration {
                shared: Arc::clone(&shared),
                id,
            },
            reset_token,
            damaged,
        ));
    }
}

/// Removes a connection from the registry however its task ends.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.shared.connections).remove(&self.id);
    }
}

/// Closes a socket with an RST instead of a FIN.
fn reset(stream: TcpStream) {
    // If the option cannot be set, the peer sees an orderly close instead,
    // which still ends the connection.
    let _ = stream.set_zero_linger();
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    registration: Registration,
    reset_token: CancellationToken,
    damaged: Arc<AtomicBool>,
) {
    let patience = lock(&registration.shared.faults).upstream_patience;
    let server = tokio::select! {
        () = reset_token.cancelled() => { reset(client); return; }
        connected = connect_within(upstream, patience) => match connected {
            Ok(server) => server,
            // The client sees what it would see from the server: a reset.
            Err(_) => { reset(client); return; }
        },
    };
    // Each chunk goes out as it was read, as the two ends sent it: with
    // Nagle's algorithm on the proxy's sockets a small write waited for the
    // ack of the one before, and the peer delays acks by up to 40 ms, so
    // back-to-back small messages (a ZooKeeper leader's proposal and
    // commit, a client's pipelined requests) took tens of milliseconds
    // that no network between the two ends would add.
    for stream in [&client, &server] {
        let _ = stream.set_nodelay(true);
    }
    let (client, server) = (Arc::new(client), Arc::new(server));
    let shared = Arc::clone(&registration.shared);
    let to_server = pump(
        Arc::clone(&client),
        Arc::clone(&server),
        Way::ToServer,
        &shared,
        &damaged,
    );
    let to_client = pump(
        Arc::clone(&server),
        Arc::clone(&client),
        Way::ToClient,
        &shared,
        &damaged,
    );
    let aborted = tokio::select! {
        () = reset_token.cancelled() => true,
        ended = to_server => ended.is_err(),
        ended = to_client => ended.is_err(),
    };
    // The pumps (the only other owners) are dropped by now.
    for stream in [client, server] {
        if let Some(stream) = Arc::into_inner(stream) {
            if aborted {
                reset(stream);
            }
        }
    }
    drop(registration);
}

/// Connects to `upstream`, dialling again every 50 ms while it refuses, for
/// up to `patience`.
async fn connect_within(upstream: SocketAddr, patience: Duration) -> io::Result<TcpStream> {
    const AGAIN: Duration = Duration::from_millis(50);
    let until = Instant::now() + patience;
    loop {
        match TcpStream::connect(upstream).await {
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionRefused
                    && Instant::now() + AGAIN < until =>
            {
                tokio::time::sleep(AGAIN).await;
            }
            connected => return connected,
        }
    }
}

/// Moves bytes one way until the source closes (`Ok`) or a socket fails
/// (`Err`). Reading and delivering are separate halves joined by a channel
/// so that latency delays each chunk without slowing the reads behind it.
async fn pump(
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    way: Way,
    shared: &Shared,
    damaged: &AtomicBool,
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let mut greeting = match way {
        Way::ToServer => lock(&shared.greeting).clone(),
        Way::ToClient => None,
    };
    let read_half = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last_delivery = Instant::now();
        // What the greeting has not decided on yet.
        let mut held = Vec::new();
        loop {
            let n = read(&from, &mut buf).await?;
            let mut chunk = buf[..n].to_vec();
            if let Some(rewrite) = &greeting {
                held.extend_from_slice(&chunk);
                chunk = match rewrite(&held) {
                    GreetingRewrite::NeedMore if n > 0 && held.len() < MAX_GREETING => continue,
                    GreetingRewrite::Replace { consumed, with } if consumed <= held.len() => {
                        let mut rewritten = with;
                        rewritten.extend_from_slice(&held[consumed..]);
                        rewritten
                    }
                    _ => std::mem::take(&mut held),
                };
                greeting = None;
            }
            let path = lock(&shared.faults).path(way);
            if chunk.is_empty() {
                // Nothing to pass on: the end of the stream, or a greeting
                // rewritten to nothing.
            } else if path.blackhole {
                damaged.store(true, Ordering::SeqCst);
                shared
                    .swallowed
                    .fetch_add(chunk.len() as u64, Ordering::SeqCst);
            } else {
                let mut delay = path.latency + random_up_to(path.jitter);
                if path.loss > 0.0 && rand::thread_rng().gen_bool(path.loss) {
                    delay += path.resend_after;
                }
                last_delivery = last_delivery.max(Instant::now() + delay);
                if tx.send((last_delivery, chunk)).await.is_err() {
                    return Ok(());
                }
            }
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
        }
    };
    let deliver_half = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            write_all(&to, &chunk).await?;
        }
        Ok::<(), io::Error>(())
    };
    // The reader ends first on EOF (dropping the sender), and the deliverer
    // then drains what is queued; an error on either side ends both.
    let (read_result, deliver_result) = tokio::join!(read_half, deliver_half);
    read_result.and(deliver_result)
}

fn random_up_to(jitter: Duration) -> Duration {
    if jitter.is_zero() {
        return Duration::ZERO;
    }
    let micros = u64::try_from(jitter.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::thread_rng().gen_range(0..=micros))
}

async fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

async fn write_all(stream: &TcpStream, mut chunk: &[u8]) -> io::Result<()> {
    while !chunk.is_empty() {
        stream.writable().await?;
        match stream.try_write(chunk) {
            Ok(n) => chunk = &chunk[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The part of a URL between `scheme://` and the path: `(userinfo@, hosts)`
/// and the byte range of the hosts in `url`.
fn authority(url: &str) -> TestResult<(std::ops::Range<usize>, &'static str)> {
    let scheme_end = url
        .find("://")
        .ok_or_else(|| format!("{url:?} is not a scheme://host URL"))?;
    let start = scheme_end + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    // Userinfo may itself contain '@' (percent-encoding is optional in
    // practice), so the hosts start after the last one.
    let hosts_start = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
    if hosts_start == end {
        return Err(format!("{url:?} names no host").into());
    }
    let default_port = match &url[..scheme_end].to_ascii_lowercase()[..] {
        "postgres" | "postgresql" => "5432",
        "mysql" | "mariadb" => "3306",
        "redis" | "rediss" | "redlock" => "6379",
        "etcd" | "http" | "https" => "2379",
        "zk" => "2181",
        other => return Err(format!("no default port known for scheme {other:?}").into()),
    };
    Ok((hosts_start..end, default_port))
}

/// Every `host:port` the URL names, resolved to socket addresses, in order:
/// one for `postgres://u:p@localhost:5432/db`, one per endpoint for
/// `etcd://h1:2379,h2:2379`. A missing port is the scheme's default.
pub fn endpoints(url: &str) -> TestResult<Vec<SocketAddr>> {
    let (hosts, default_port) = authority(url)?;
    url[hosts]
        .split(',')
        .map(|host| {
            let with_port = if host.ends_with(']') || !host.contains(':') {
                format!("{host}:{default_port}")
            } else {
                host.to_owned()
            };
            with_port
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| format!("{host:?} resolves to no address").into())
        })
        .collect()
}

/// `url` with its endpoints replaced by `endpoints`, in order; scheme,
/// userinfo, path and query are kept.
pub fn with_endpoints(url: &str, endpoints: &[SocketAddr]) -> TestResult<String> {
    if endpoints.is_empty() {
        return Err("a URL needs at least one endpoint".into());
    }
    let (hosts, _) = authority(url)?;
    let joined = endpoints
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",");
    Ok(format!(
        "{}{joined}{}",
        &url[..hosts.start],
        &url[hosts.end..]
    ))
}

/// A URL routed through one [`FaultProxy`] per endpoint, with switches that
/// act on all of them at once (the whole server set is behind one network).
#[derive(Debug)]
pub struct ProxiedUrl {
    url: String,
    proxies: Vec<FaultProxy>,
}

impl ProxiedUrl {
    /// Starts a proxy for every endpoint of `url`.
    pub async fn start(url: &str) -> TestResult<ProxiedUrl> {
        let mut proxies = Vec::new();
        for upstream in endpoints(url)? {
            proxies.push(FaultProxy::start(upstream).await?);
        }
        let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
        Ok(ProxiedUrl {
            url: with_endpoints(url, &addrs)?,
            proxies,
        })
    }

    /// The URL to connect through the proxies.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The proxies, in the order of the URL's endpoints.
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }

    /// [`ProxyControls::set_latency`] on every proxy.
    pub fn set_latency(&self, direction: Direction, base: Duration, jitter: Duration) {
        self.each(|c| c.set_latency(direction, base, jitter));
    }

    /// [`ProxyControls::set_blackhole`] on every proxy.
    pub fn set_blackhole(&self, direction: Direction, on: bool) {
        self.each(|c| c.set_blackhole(direction, on));
    }

    /// [`ProxyControls::partition`] on every proxy.
    pub fn partition(&self) {
        self.each(ProxyControls::partition);
    }

    /// [`ProxyControls::set_refuse`] on every proxy.
    pub fn set_refuse(&self, on: bool) {
        self.each(|c| c.set_refuse(on));
    }

    /// [`ProxyControls::reset_all`] on every proxy.
    pub fn reset_all(&self) {
        self.each(ProxyControls::reset_all);
    }

    /// [`ProxyControls::heal`] on every proxy.
    pub fn heal(&self) {
        self.each(ProxyControls::heal);
    }

    fn each(&self, f: impl Fn(&ProxyControls)) {
        for proxy in &self.proxies {
            f(&proxy.controls);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn endpoints_of_each_url_shape() {
        assert_eq!(
            endpoints("postgres://u:p@ss@127.0.0.1:6543/db?x=1").unwrap(),
            [addr("127.0.0.1:6543")]
        );
        assert_eq!(
            endpoints("etcd://127.0.0.1:1,127.0.0.1:2").unwrap(),
            [addr("127.0.0.1:1"), addr("127.0.0.1:2")]
        );
        assert_eq!(
            endpoints("redis://localhost").unwrap(),
            [addr("127.0.0.1:6379")]
        );
        assert_eq!(endpoints("mysql://[::1]/db").unwrap(), [addr("[::1]:3306")]);
        for bad in ["sqlite:///tmp/x.db", "no-scheme", "postgres://u@/db"] {
            assert!(endpoints(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn with_endpoints_keeps_everything_else() {
        let to = [addr("127.0.0.1:9")];
        assert_eq!(
            with_endpoints("postgres://u:p@w@localhost:5432/db?sslmode=disable", &to).unwrap(),
            "postgres://u:p@w@127.0.0.1:9/db?sslmode=disable"
        );
        assert_eq!(
            with_endpoints(
                "etcd://a:1,b:2?prefix=x",
                &[addr("127.0.0.1:3"), addr("127.0.0.1:4")]
            )
            .unwrap(),
            "etcd://127.0.0.1:3,127.0.0.1:4?prefix=x"
        );
        assert!(with_endpoints("redis://h:1", &[]).is_err());
    }
}
