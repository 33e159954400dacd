//! `balance=first`: a backend's session stays on the first server of its
//! URL that accepts one, moves to the next when that server is lost, and
//! moves back once it accepts sessions again. Across data centres that
//! keeps a client on its own site's member (`docs/multi-dc.md`); a member
//! lost must cost its clients nothing.
//!
//! Time: a real ensemble whose members are killed and started, so no
//! paused clock. A patience measured against the ensemble first scales the
//! lease that must not be lost through the move (a base of 4 s, watched for
//! three TTLs) and every wait for what must happen (a base of 30 s). One
//! bound cannot grow: the feed's notice must come before the old session
//! (40 s, the longest the server allows) could have expired, or the
//! expiry, not the moved watch, could be what reports it.

use std::{sync::Arc, time::Duration};

use fencelock_core::{Backend, Change, LockClient};
use fencelock_testkit::{servers::zookeeper::ZkServer, Patience, TestResult};
use fencelock_zookeeper::ZkBackend;
use tokio::time::{timeout, Instant};

/// The lease kept through the move, as a base figure.
const TTL: Duration = Duration::from_secs(4);
/// Bound on waiting for what must happen, as a base figure; never a
/// timing assertion.
const BOUND: Duration = Duration::from_secs(30);
/// The backend's session timeout: the longest the test kit's `tickTime`
/// allows, so that what moves the sessions is the steward.
const SESSION: Duration = Duration::from_secs(40);

/// Whether member `on` carries `n` more connections than each of the
/// others that run (each count includes the `srvr` question's own): the
/// backend's sessions, and no other client's. Not while one of them does
/// not serve yet.
fn carries_the_sessions(zk: &ZkServer, on: usize, n: u32) -> TestResult<bool> {
    let Some(mine) = zk.connections(on)? else {
        return Ok(false);
    };
    for other in (0..zk.len()).filter(|&i| i != on && zk.is_running(i)) {
        if zk.connections(other)?.map(|count| count + n) != Some(mine) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Waits (polling the members' own counts) until member `on` carries the
/// backend's `n` sessions.
async fn sessions_move_to(zk: &Arc<ZkServer>, on: usize, n: u32, p: Patience) -> TestResult {
    let bound = p.bound(BOUND);
    let end = Instant::now() + bound;
    loop {
        let zk2 = Arc::clone(zk);
        if tokio::task::spawn_blocking(move || carries_the_sessions(&zk2, on, n)).await?? {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(
                format!("the sessions are not on member {on} after {bound:?} ({p})").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_first_keeps_the_session_on_the_first_member_that_answers() -> TestResult {
    let zk = Arc::new(tokio::task::spawn_blocking(|| ZkServer::start_members(3)).await??);
    // A follower first, so that losing it costs no election.
    let leader = {
        let zk = Arc::clone(&zk);
        tokio::task::spawn_blocking(move || zk.leader()).await?
    };
    let first = (0..3).find(|&i| Some(i) != leader).ok_or("no follower")?;
    let next = (0..3).find(|&i| i != first).ok_or("one member")?;
    let order = [first, next, 3 - first - next];
    let servers: Vec<String> = order.iter().map(|&i| zk.endpoint(i)).collect();
    // A session that outlasts the bounds below: what moves it is the
    // steward.
    let url = format!(
        "zk://{}?balance=first&session_timeout={}ms",
        servers.join(","),
        SESSION.as_millis()
    );

    // Measured with the members' `srvr` question, which leaves no
    // session behind: the counts below are the backend's alone.
    let p = Patience::with_round_trip(|| {
        let zk = Arc::clone(&zk);
        async move {
            let _ = tokio::task::spawn_blocking(move || zk.connections(first)).await;
        }
    })
    .await;
    let ttl = p.ttl(TTL);
    let backend = Arc::new(ZkBackend::connect(&url).await?);
    let client = LockClient::new(backend.clone());
    let mut feed = backend.changes().await?.ok_or("no change feed")?;
    // The backend's session, and its change feed's.
    sessions_move_to(&zk, first, 2, p).await?;
    let guard = client.lock("kept").ttl(ttl).acquire().await?;

    // The first member dies: the sessions move to the next in order, and
    // the lease is renewed through it.
    zk.kill(first)?;
    let killed = Instant::now();
    sessions_move_to(&zk, next, 2, p).await?;
    while feed.try_next().is_some() {}
    client
        .lock("named")
        .ttl(ttl)
        .acquire()
        .await?
        .release()
        .await?;
    // The feed's watch followed its session: the change is named (or, had
    // it come while the watch moved, the feed says notices were missed).
    // Its old session would only have expired a session timeout after the
    // kill: the wait ends before that, however patient.
    let notice_by = (Instant::now() + p.bound(BOUND)).min(killed + SESSION);
    let notice = tokio::time::timeout_at(notice_by, async {
        loop {
            match feed.next().await {
                Some(Change::Key(k)) if k == "named" => return Ok(()),
                Some(Change::Missed) => return Ok(()),
                Some(_) => {}
                None => return Err("the feed ended"),
            }
        }
    })
    .await;
    notice.map_err(|_| {
        format!(
            "the feed named nothing after the move, {:?} after the kill ({p})",
            killed.elapsed()
        )
    })??;
    let lost = guard.lost();
    if let Ok(why) = timeout(ttl * 3, lost).await {
        return Err(format!("the lease was lost: {why:?} ({p})").into());
    }
    assert!(guard.is_valid());
    let other = client
        .lock("taken")
        .ttl(ttl)
        .wait(p.bound(BOUND))
        .acquire()
        .await?;
    other.release().await?;

    // Back, once the first member accepts sessions again.
    zk.start_again(first)?;
    sessions_move_to(&zk, first, 2, p).await?;
    assert!(guard.is_valid());
    guard.release().await?;
    Ok(())
}
