//! Connections and their limits (`docs/http.md`, "Connections and their
//! limits"): a flood of idle or half-sent sockets never keeps `/healthz`
//! out, idle and slow connections are closed after their timeouts, and long
//! polls and event streams outlive both.
//!
//! Time: a real server on real sockets (tokio's paused clock would fire
//! the server's own timeouts while the sockets' bytes are still on their
//! way). Each test measures a [`Patience`] first and scales from it the
//! short timeouts it gives the server (bases [`HEADER`] and [`IDLE`]: a
//! kept-alive connection idles between the two, and on a busy machine a
//! fixed gap would close it early) and the slack allowed beyond them (base
//! [`SLACK`]); a failure names the budget. A check that a stream stays
//! open (200 ms) is one load cannot fail.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{path::PathBuf, sync::Arc, time::Duration};

use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
use fencelock_serve::{Limits, Server, ServerHandle, Service};
use fencelock_testkit::Patience;
use futures_util::StreamExt;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

/// The base of the slack on top of a timeout before a socket must have
/// been closed: a bound on a loaded machine, never a measurement.
const SLACK: Duration = Duration::from_secs(5);

struct Running {
    /// The budget measured when it started.
    p: Patience,
    /// `SLACK` scaled.
    slack: Duration,
    _handle: ServerHandle,
    addr: std::net::SocketAddr,
    /// The base URL and a client that trusts the server (its CA under TLS).
    base: String,
    http: reqwest::Client,
    _dir: Option<tempfile::TempDir>,
}

/// A budget measured now.
async fn measured() -> Patience {
    Patience::measure().await
}

async fn start(limits: Limits, tls: bool, p: Patience) -> Running {
    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .build();
    let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap()
        .limits(limits);
    let addr = server.local_addr();
    let (base, http, dir) = if tls {
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = write_cert(&dir);
        server = server.tls(cert_path.clone(), key_path);
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert_path).unwrap()).unwrap();
        let http = reqwest::Client::builder()
            .add_root_certificate(ca)
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        (
            format!("https://localhost:{}", addr.port()),
            http,
            Some(dir),
        )
    } else {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        (format!("http://{addr}"), http, None)
    };
    Running {
        p,
        slack: p.bound(SLACK),
        _handle: server.spawn(),
        addr,
        base,
        http,
        _dir: dir,
    }
}

fn write_cert(dir: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    (cert_path, key_path)
}

/// Whether the server closes `socket` before `by`: reads until the end of
/// the stream (or a reset), whatever it answers first.
async fn closed_by(socket: &mut TcpStream, by: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(by, socket.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn healthz(run: &Running) -> reqwest::StatusCode {
    let answer = tokio::time::timeout(
        run.slack,
        run.http.get(format!("{}/healthz", run.base)).send(),
    )
    .await
    .unwrap_or_else(|_| panic!("/healthz did not answer under the flood [{}]", run.p))
    .unwrap();
    answer.status()
}

/// Opens `idle` sockets that send nothing and `slow` that send part of a
/// request head and stop.
async fn flood(addr: std::net::SocketAddr, idle: usize, slow: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::new();
    for i in 0..idle + slow {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        if i >= idle {
            socket
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        sockets.push(socket);
    }
    sockets
}

/// With timeouts far away, only the cap can close sockets: a flood of 150
/// idle and half-sent sockets against a cap of 40 leaves at most 40 open,
/// and `/healthz` answers in the middle of it.
async fn a_flood_never_keeps_healthz_out(tls: bool) {
    let max = 40;
    let run = start(
        Limits {
            header_read_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
            max_connections: Some(max),
            ..Limits::default()
        },
        tls,
        measured().await,
    )
    .await;
    let mut sockets = flood(run.addr, 100, 50).await;
    assert_eq!(healthz(&run).await, reqwest::StatusCode::OK);
    // A second flood after the first: still answered.
    sockets.extend(flood(run.addr, 50, 0).await);
    assert_eq!(healthz(&run).await, reqwest::StatusCode::OK);
    let by = Instant::now() + run.slack;
    let mut closed = 0;
    for socket in &mut sockets {
        if closed_by(socket, by).await {
            closed += 1;
        }
    }
    let open = sockets.len() - closed;
    assert!(
        open <= max,
        "{open} of {} flooding sockets still open; the cap is {max} [{}]",
        sockets.len(),
        run.p
    );
}

#[tokio::test]
async fn a_flood_of_idle_and_slow_sockets_never_keeps_healthz_out() {
    a_flood_never_keeps_healthz_out(false).await;
}

#[tokio::test]
async fn a_flood_of_idle_and_slow_sockets_never_keeps_healthz_out_over_tls() {
    a_flood_never_keeps_healthz_out(true).await;
}

/// The bases of the short timeouts the server is given.
const HEADER: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_secs(4);

/// The short timeouts scaled by `p`: (limits, header-read, idle).
fn short(p: &Patience) -> (Limits, Duration, Duration) {
    let (header, idle) = (p.bound(HEADER), p.bound(IDLE));
    let limits = Limits {
        header_read_timeout: header,
        idle_timeout: idle,
        ..Limits::default()
    };
    (limits, header, idle)
}

/// A socket that never sends a request, and one that stops in the middle
/// of its head, are closed within the header-read timeout (plus slack).
async fn silent_and_slow_sockets_are_closed(tls: bool) {
    let p = measured().await;
    let (limits, header, _) = short(&p);
    let run = start(limits, tls, p).await;
    let mut sockets = flood(run.addr, 1, 1).await;
    let by = Instant::now() + header + run.slack;
    for (i, socket) in sockets.iter_mut().enumerate() {
        assert!(
            closed_by(socket, by).await,
            "socket {i} (0: silent, 1: half a head) outlived the header-read timeout [{p}]"
        );
    }
}

#[tokio::test]
async fn silent_and_slow_sockets_are_closed_after_the_header_read_timeout() {
    silent_and_slow_sockets_are_closed(false).await;
}

#[tokio::test]
async fn silent_sockets_are_closed_after_the_header_read_timeout_over_tls() {
    silent_and_slow_sockets_are_closed(true).await;
}

/// A kept-alive connection may sit idle past the header-read timeout (its
/// client is not slow, it has nothing to ask), and is closed once it sat
/// idle for the idle timeout.
#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let p = measured().await;
    let (limits, header, idle) = short(&p);
    let run = start(limits, false, p).await;
    let mut socket = TcpStream::connect(run.addr).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut answer = [0u8; 4096];
    for _ in 0..2 {
        socket.write_all(request).await.unwrap();
        let n = socket.read(&mut answer).await.unwrap();
        let head = String::from_utf8_lossy(&answer[..n]);
        assert!(head.starts_with("HTTP/1.1 200"), "{head} [{p}]");
        // Twice the header-read timeout, half the idle one.
        tokio::time::sleep(header * 2).await;
    }
    let by = Instant::now() + idle + run.slack;
    assert!(
        closed_by(&mut socket, by).await,
        "still open after the idle timeout [{p}]"
    );
}

/// Long polls and event streams are requests in flight, never idle: both
/// outlive the idle and header-read timeouts.
#[tokio::test]
async fn long_polls_and_event_streams_outlive_the_idle_timeout() {
    let p = measured().await;
    let (limits, header, idle) = short(&p);
    let run = start(limits, false, p).await;
    let acquire = |owner: &'static str, wait_ms: u64| {
        run.http
            .post(format!("{}/v1/locks/k/acquire", run.base))
            .json(&serde_json::json!({"owner": owner, "ttl_ms": 60000, "wait_ms": wait_ms}))
            .send()
    };
    let mut events = run
        .http
        .get(format!("{}/v1/events", run.base))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    let grant = acquire("a", 0).await.unwrap();
    assert_eq!(grant.status(), 200);
    let grant: serde_json::Value = grant.json().await.unwrap();
    let waited = Instant::now();
    let poll = acquire("b", u64::try_from((idle + header).as_millis()).unwrap())
        .await
        .unwrap();
    assert_eq!(poll.status(), 409, "{:?} [{p}]", poll.text().await);
    assert!(waited.elapsed() >= idle, "{:?}", waited.elapsed());
    // The stream, quiet since the first grant for longer than the idle
    // timeout, still delivers: the first grant, then a release.
    let mut seen = String::new();
    let released = reqwest::Client::new()
        .post(format!("{}/v1/locks/k/release", run.base))
        .json(&serde_json::json!({"owner": "a", "token": grant["token"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    tokio::time::timeout(run.slack, async {
        while !seen.contains("event: released") {
            let chunk = events.next().await.expect("the stream ended").unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no release on the stream [{p}]: {seen}"));
}

/// A cap filled by requests in flight (event streams here; long polls
/// alike) closes no busy connection, yet `/healthz` still answers 200 on a
/// spare connection, and any other request there is told to come back
/// (503 `unavailable` with `retry_after_ms`) instead of finding its
/// connection closed.
#[tokio::test]
async fn a_cap_full_of_busy_connections_still_answers_healthz() {
    let max = 3;
    let run = start(
        Limits {
            max_connections: Some(max),
            ..Limits::default()
        },
        false,
        measured().await,
    )
    .await;
    let mut streams = Vec::new();
    for _ in 0..max {
        let stream = run
            .http
            .get(format!("{}/v1/events", run.base))
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200);
        streams.push(stream);
    }
    assert_eq!(healthz(&run).await, 200);
    let refused = tokio::time::timeout(
        run.slack,
        run.http.get(format!("{}/v1/locks", run.base)).send(),
    )
    .await
    .unwrap_or_else(|_| panic!("a request over a full cap did not answer [{}]", run.p))
    .unwrap();
    assert_eq!(refused.status(), 503);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(body["retry_after_ms"].as_u64().unwrap() > 0, "{body}");
    // The streams were never cut to make room: each is quiet or sends,
    // none has ended or failed.
    for stream in &mut streams {
        let read = tokio::time::timeout(Duration::from_millis(200), stream.chunk()).await;
        assert!(
            !matches!(read, Ok(Ok(None) | Err(_))),
            "a busy stream was closed: {read:?}"
        );
    }
    // Each spare closes after its answer and is counted free again:
    // more checks than there are spares all answer.
    for _ in 0..40 {
        assert_eq!(healthz(&run).await, 200);
    }
}
