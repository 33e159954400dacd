//! Which members a client's requests go to.
//!
//! - `balance=first`: every request goes to the first endpoint that
//!   answers, in the URL's order, and the others only while it does not.
//!   Across data centres the balanced default sent most of a client's
//!   requests to members far away (docs/multi-dc.md). Which member a
//!   request reached is read from each member's own count of the gRPC
//!   requests it handled.
//! - `balance=all`: every endpoint that answers, so a member cut off by a
//!   silent network is left out.
//!
//! Time: real clusters. Each test measures a [`Patience`] against its
//! cluster first and scales from it the bound of each wait for the client
//! to move on (15 s, 30 s) and the request `timeout` the silent member
//! costs (base 1 s); a failure names the budget. The counts of requests
//! per member are no matter of time.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, LockKey, Owner};
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{
    proxy::{with_endpoints, ProxiedUrl},
    servers::etcd::EtcdCluster,
    Patience, TestResult,
};
use tokio::time::Instant;

/// A budget measured against `url`'s cluster.
async fn measured(url: &str) -> TestResult<Patience> {
    let probe = EtcdBackend::connect(url).await?;
    Ok(Patience::against(&probe).await)
}

/// Txns each member has handled.
fn txns(cluster: &EtcdCluster) -> TestResult<Vec<u64>> {
    (0..cluster.len())
        .map(|i| {
            if cluster.is_running(i) {
                cluster.handled(i, "Txn")
            } else {
                Ok(0)
            }
        })
        .collect()
}

/// `rounds` acquire+release cycles of one key, each granted.
async fn cycles(b: &EtcdBackend, rounds: usize) -> TestResult {
    let req = AcquireRequest::new(
        LockKey::new("balanced")?,
        Owner::new("a")?,
        Duration::from_secs(10),
    );
    for _ in 0..rounds {
        match b.try_acquire(&req).await? {
            Acquire::Granted(g) => b.release(&req.lease(g.token)).await?,
            other => return Err(format!("expected a grant, got {other:?}").into()),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_first_sends_every_request_to_the_first_member_that_answers() -> TestResult {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start_members(3)).await??;
    let p = measured(&cluster.url()).await?;
    let addrs: Vec<_> = (0..3).map(|i| cluster.slot(i).addr()).collect();
    // Member 2 first, then 0, then 1.
    let url = with_endpoints(&cluster.url(), &[addrs[2], addrs[0], addrs[1]])?;
    let b = EtcdBackend::connect(&format!("{url}?balance=first")).await?;
    let before = txns(&cluster)?;
    cycles(&b, 20).await?;
    let after = txns(&cluster)?;
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(sent[2] >= 40, "two Txns a cycle to member 2: {sent:?}");
    assert_eq!((sent[0], sent[1]), (0, 0), "{sent:?}");

    // Member 2 gone: the requests move to member 0, the next in order,
    // within a few probes.
    cluster.kill(2)?;
    let bound = p.bound(Duration::from_secs(15));
    let deadline = Instant::now() + bound;
    while cycles(&b, 1).await.is_err() {
        if Instant::now() >= deadline {
            return Err(
                format!("no grant within {bound:?} of the first member's death [{p}]").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = txns(&cluster)?;
    cycles(&b, 10).await?;
    let after = txns(&cluster)?;
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(sent[0] >= 20, "member 0 is next in order: {sent:?}");
    assert_eq!(sent[1], 0, "{sent:?}");
    Ok(())
}

/// One acquire+release cycle of a key of its own.
async fn fresh_cycle(b: &EtcdBackend, n: usize) -> TestResult {
    let req = AcquireRequest::new(
        LockKey::new(format!("fresh-{n}"))?,
        Owner::new("a")?,
        Duration::from_secs(10),
    );
    match b.try_acquire(&req).await? {
        Acquire::Granted(g) => Ok(b.release(&req.lease(g.token)).await?),
        other => Err(format!("expected a grant, got {other:?}").into()),
    }
}

/// `balance=all` (the default) with a member cut off from its clients by
/// a silent network (its connections stay open, nothing answers): a client
/// opened meanwhile never sends it anything, and a client opened before
/// takes it out of its channel, so that its requests stop failing. Before,
/// the channel went on handing that member about a third of every
/// client's requests, each of which waited out its time-out: a lock
/// acquisition and release, two such requests, failed more often than
/// not, for as long as the silence lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_all_leaves_out_a_member_that_does_not_answer() -> TestResult {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start_members(3)).await??;
    let proxied = ProxiedUrl::start(&cluster.url()).await?;
    let p = measured(proxied.url()).await?;
    let url = format!(
        "{}?timeout={}ms",
        proxied.url(),
        p.bound(Duration::from_secs(1)).as_millis()
    );
    let before = EtcdBackend::connect(&url).await?;
    for n in 0..3 {
        fresh_cycle(&before, n).await?;
    }
    proxied.proxies()[2].controls().partition();

    let opened = EtcdBackend::connect(&url).await?;
    for n in 100..120 {
        fresh_cycle(&opened, n)
            .await
            .map_err(|e| format!("a client opened after the cut: {e} [{p}]"))?;
    }

    let bound = p.bound(Duration::from_secs(30));
    let deadline = Instant::now() + bound;
    let (mut n, mut in_a_row) = (200, 0);
    while in_a_row < 20 {
        n += 1;
        match fresh_cycle(&before, n).await {
            Ok(()) => in_a_row += 1,
            Err(_) => in_a_row = 0,
        }
        if Instant::now() >= deadline {
            return Err(format!("{in_a_row} cycles in a row granted after {bound:?} [{p}]").into());
        }
    }
    proxied.proxies()[2].controls().heal();
    Ok(())
}
