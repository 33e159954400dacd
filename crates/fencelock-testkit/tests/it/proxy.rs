//! The fault proxy against a real TCP echo server on loopback: every fault
//! does what it says, and nothing else.
#![allow(clippy::unwrap_used)]

use std::{
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_testkit::proxy::{Direction, FaultProxy, Greeting, GreetingRewrite};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// An echo server that counts the bytes it received.
async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    counter.fetch_add(n, Ordering::SeqCst);
                    if socket.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, received)
}

async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> io::Result<Vec<u8>> {
    stream.write_all(message).await?;
    let mut reply = vec![0u8; message.len()];
    stream.read_exact(&mut reply).await?;
    Ok(reply)
}

/// 100 one-byte writes come back in order, whatever each was delayed by.
async fn assert_order_kept(stream: &mut TcpStream) {
    let mut expected = Vec::new();
    for i in 0..100u8 {
        stream.write_all(&[i]).await.unwrap();
        expected.push(i);
    }
    let mut echoed = vec![0u8; expected.len()];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(echoed, expected);
}

/// A read that ends the connection: EOF or an error such as a reset.
async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("the connection stayed open");
    match read {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("read {n} bytes from a connection that should be closed"),
    }
}

#[tokio::test]
async fn forwards_both_ways_and_counts_connections() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    assert_eq!(proxy.upstream(), server);
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"hello").await.unwrap(), b"hello");
    assert_eq!(round_trip(&mut b, b"world").await.unwrap(), b"world");
    assert_eq!(proxy.controls().connections(), 2);

    // A large transfer crosses many chunks intact.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut a, &big).await.unwrap(), big);
}

#[tokio::test]
async fn latency_delays_and_keeps_order() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    controls.set_latency(
        Direction::ToServer,
        Duration::from_millis(30),
        Duration::from_millis(20),
    );
    // The injected delay is a lower bound, not a performance figure.
    let started = tokio::time::Instant::now();
    round_trip(&mut stream, b"x").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(30));

    // Jitter larger than the gap between writes must not reorder them.
    controls.set_latency(Direction::Both, Duration::ZERO, Duration::from_millis(10));
    assert_order_kept(&mut stream).await;
}

#[tokio::test]
async fn a_lost_chunk_arrives_a_resend_late_and_holds_the_ones_behind_it() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let resend = Duration::from_millis(200);
    // Every chunk lost one way: each round trip pays one resend, at least.
    controls.set_loss(Direction::ToClient, 1.0, resend);
    let started = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut stream, b"late").await.unwrap(), b"late");
    assert!(started.elapsed() >= resend);

    // Half lost, both ways: nothing is reordered or dropped.
    controls.set_loss(Direction::Both, 0.5, Duration::from_millis(5));
    assert_order_kept(&mut stream).await;

    // Healed: no loss left (the 10 s resend would show as a time-out).
    controls.set_loss(Direction::Both, 1.0, Duration::from_secs(10));
    controls.heal();
    let reply = tokio::time::timeout(Duration::from_secs(5), round_trip(&mut stream, b"on time"))
        .await
        .expect("heal left the loss on");
    assert_eq!(reply.unwrap(), b"on time");
}

#[tokio::test]
async fn blackhole_swallows_then_resets_damaged_connections_on_heal() {
    let (server, received) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut damaged = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut untouched = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut untouched, b"ok").await.unwrap();
    let before = received.load(Ordering::SeqCst);

    controls.partition();
    damaged.write_all(b"lost").await.unwrap();
    wait_until(|| controls.swallowed_bytes() >= 4).await;
    controls.heal();
    assert_closed(&mut damaged).await;
    assert_eq!(
        received.load(Ordering::SeqCst),
        before,
        "the server saw swallowed bytes"
    );
    // A connection that lost nothing lives on, and new ones work.
    assert_eq!(
        round_trip(&mut untouched, b"still").await.unwrap(),
        b"still"
    );
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut fresh, b"new").await.unwrap(), b"new");
}

/// Polls a condition the proxy's tasks will make true, failing the test if
/// they never do.
async fn wait_until(condition: impl Fn() -> bool) {
    let poll = async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the proxy never got there");
}

#[tokio::test]
async fn blackhole_one_way_lets_requests_through_but_not_replies() {
    let (server, received) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    controls.set_blackhole(Direction::ToClient, true);
    stream.write_all(b"request").await.unwrap();
    // The request reaches the server (the ambiguous-acquire shape)...
    wait_until(|| received.load(Ordering::SeqCst) >= 7).await;
    // The echo is what gets swallowed.
    wait_until(|| controls.swallowed_bytes() >= 7).await;
    // ...its reply is swallowed, and the connection is reset on heal.
    controls.set_blackhole(Direction::ToClient, false);
    assert_closed(&mut stream).await;
}

#[tokio::test]
async fn refuse_resets_new_connections_only() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut existing = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut existing, b"a").await.unwrap();
    controls.set_refuse(true);
    let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(round_trip(&mut refused, b"b").await.is_err());
    assert_eq!(round_trip(&mut existing, b"c").await.unwrap(), b"c");
    controls.set_refuse(false);
    let mut accepted = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut accepted, b"d").await.unwrap(), b"d");
}

#[tokio::test]
async fn reset_all_and_drop_end_every_connection() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    let controls = proxy.controls();
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut first, b"a").await.unwrap();
    controls.reset_all();
    let mut buf = [0u8; 1];
    let err = first.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);

    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut second, b"b").await.unwrap();
    let addr = proxy.addr();
    drop(proxy);
    assert_closed(&mut second).await;
    // The listener is gone too.
    let after = TcpStream::connect(addr).await;
    if let Ok(mut s) = after {
        assert!(round_trip(&mut s, b"c").await.is_err());
    }
    drop(controls);
}

#[tokio::test]
async fn an_unreachable_upstream_looks_like_a_reset() {
    // Bind then drop: nothing listens on this port any more.
    let gone = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = FaultProxy::start(gone).await.unwrap();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(round_trip(&mut stream, b"x").await.is_err());
}

/// With a patience, a port that opens a moment after the client connected
/// is reached, as the client's own retry of a refused dial would reach it;
/// without one, the client is reset (above).
#[tokio::test]
async fn a_patient_proxy_reaches_a_port_that_opens_late() {
    // Bound but not listening: connections to it are refused until then.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let late = socket.local_addr().unwrap();
    let proxy = FaultProxy::start(late).await.unwrap();
    proxy
        .controls()
        .set_upstream_patience(Duration::from_secs(10));
    let client = tokio::spawn(async move {
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        let reply = round_trip(&mut stream, b"late").await;
        drop(proxy);
        reply
    });
    // The server opens its port after the client's first bytes are sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listener = socket.listen(16).unwrap();
    let (mut accepted, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the proxy never dialled the port again")
        .unwrap();
    let mut buf = [0u8; 4];
    accepted.read_exact(&mut buf).await.unwrap();
    accepted.write_all(&buf).await.unwrap();
    assert_eq!(client.await.unwrap().unwrap(), b"late");
}

/// A greeting rewriter sees the first message of each new connection
/// towards the server, however it was split into writes, and what it
/// replaces reaches the server instead; the bytes behind it, the replies
/// and connections that do not match pass as they are.
#[tokio::test]
async fn a_greeting_is_rewritten_once_per_connection() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server).await.unwrap();
    // "HELLO <n>;" becomes "HI <n>;"; anything else is kept.
    let greeting: Greeting = Arc::new(|sent: &[u8]| {
        if !b"HELLO ".starts_with(&sent[..sent.len().min(6)]) {
            return GreetingRewrite::Keep;
        }
        match sent.iter().position(|&b| b == b';') {
            None => GreetingRewrite::NeedMore,
            Some(end) => {
                let mut with = b"HI ".to_vec();
                with.extend_from_slice(&sent[6..=end]);
                GreetingRewrite::Replace {
                    consumed: end + 1,
                    with,
                }
            }
        }
    });
    proxy.controls().set_greeting(Some(greeting));
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    for part in [&b"HEL"[..], b"LO 4", b"2;and"] {
        a.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut echoed = vec![0u8; b"HI 42;and".len()];
    a.read_exact(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"HI 42;and");
    // Only the first message: a second greeting on the stream passes.
    assert_eq!(round_trip(&mut a, b"HELLO 7;").await.unwrap(), b"HELLO 7;");
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut b, b"PING;").await.unwrap(), b"PING;");
    // Turned off: new connections pass as they are.
    proxy.controls().set_greeting(None);
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"HELLO 1;").await.unwrap(), b"HELLO 1;");
}
