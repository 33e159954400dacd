//! A session that expired behind a partition comes back for callers that
//! each give up sooner than a new session takes to form: the new session
//! forms in the background, not inside whichever caller asked first.
//!
//! Time: a real server behind a real proxy, so no paused clock. A patience
//! measured against the server first scales the simulated latency, the
//! callers' patience (three round trips of it), the session and the
//! `timeout` together from their base figures: the callers still give up
//! sooner than a session forms and later than an inspection takes on a
//! busy machine, so the test keeps telling the two designs apart. The
//! session is capped at the longest the server allows (40 s).

use std::time::{Duration, Instant};

use fencelock_core::{Backend, LockKey};
use fencelock_testkit::{
    proxy::{Direction, ProxiedUrl},
    servers::zookeeper::ZkServer,
    TestResult,
};
use fencelock_zookeeper::ZkBackend;

/// The server's least session timeout (2 × the test kit's `tickTime`), as
/// a base figure.
const SESSION: Duration = Duration::from_secs(4);
/// The server's longest session timeout (20 × its `tickTime`).
const LONGEST_SESSION: Duration = Duration::from_secs(40);
/// One way between the client and the server, as a base figure.
const ONE_WAY: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_callers_do_not_keep_an_expired_session_from_coming_back() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    let one_way = p.bound(ONE_WAY);
    let session = p.ttl(SESSION).min(LONGEST_SESSION);
    let proxied = ProxiedUrl::start(&zk.url()).await?;
    proxied.set_latency(Direction::Both, one_way, Duration::ZERO);
    let backend = ZkBackend::connect(&format!(
        "{}?session_timeout={}ms&timeout={}ms",
        proxied.url(),
        session.as_millis(),
        p.bound(Duration::from_secs(2)).as_millis()
    ))
    .await?;
    let key = LockKey::new("reconnect")?;
    backend.inspect(&key).await?;

    // Cut off for longer than the client keeps a silent session (7/5 of
    // its timeout) and the server keeps it (one timeout): it has expired
    // on both sides when the network comes back, latency and all.
    proxied.set_blackhole(Direction::Both, true);
    tokio::time::sleep(session * 2).await;
    proxied.set_blackhole(Direction::Both, false);

    // Each caller gives up after three round trips: more than an
    // inspection takes (the leader's clock, then the key's children),
    // less than a session and the store's directories took one after the
    // other when the first caller made them. Callers after the new session
    // has formed succeed.
    let rtt = 2 * one_way;
    let gives_up_after = 3 * rtt;
    let started = Instant::now();
    let mut gave_up = 0;
    loop {
        match tokio::time::timeout(gives_up_after, backend.inspect(&key)).await {
            Ok(Ok(_)) => break,
            // The expired session's own answer: the next call starts anew.
            Ok(Err(e)) if e.is_transient() => gave_up += 1,
            Ok(Err(e)) => {
                return Err(format!("inspect after the partition failed: {e} ({p})").into())
            }
            Err(_) => gave_up += 1,
        }
        // Fifty callers in a row without an answer would mean the session
        // is not coming back.
        assert!(
            gave_up < 50,
            "no caller got an answer in {:?} after the partition healed ({p})",
            started.elapsed()
        );
    }
    Ok(())
}
