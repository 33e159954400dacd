//! Redlock under node faults: a killed node, a node restarted empty
//! (quarantine and token floor), and minority partitions.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, FencingToken, LockKey, Owner};
use fencelock_redlock::RedlockBackend;
use fencelock_testkit::{proxy::ProxiedUrl, servers::redis_set::RedisSet, TestResult};
use tokio::time::Instant;

fn request(key: &str, owner: &str, ttl: Duration) -> TestResult<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockKey::new(key)?,
        Owner::new(owner)?,
        ttl,
    ))
}

fn granted(answer: Acquire) -> TestResult<FencingToken> {
    match answer {
        Acquire::Granted(g) => Ok(g.token),
        other => Err(format!("expected a grant, got {other:?}").into()),
    }
}

async fn open(url: &str) -> TestResult<RedlockBackend> {
    Ok(RedlockBackend::connect(url).await?)
}

/// Whether node `i` of `set` carries the redlock marker (is formed), read
/// with a plain connection.
async fn formed(set: &RedisSet, i: usize) -> TestResult<bool> {
    let client = redis::Client::open(set.node_url(i))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let exists: i64 = redis::cmd("EXISTS")
        .arg("fencelock:redlock")
        .query_async(&mut conn)
        .await?;
    Ok(exists == 1)
}

/// Runs `attempt` (which must never grant) until node `i` has rejoined.
async fn until_rejoined(
    set: &RedisSet,
    i: usize,
    b: &RedlockBackend,
    req: &AcquireRequest,
) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !formed(set, i).await? {
        if let Ok(Acquire::Granted(g)) = b.try_acquire(req).await {
            return Err(format!("granted token {} while the key is held", g.token).into());
        }
        if Instant::now() >= deadline {
            return Err(format!("node {i} never rejoined").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Retries `try_acquire` until it is granted or `within` has passed.
async fn acquire_within(
    b: &RedlockBackend,
    req: &AcquireRequest,
    within: Duration,
) -> TestResult<FencingToken> {
    let deadline = Instant::now() + within;
    loop {
        match b.try_acquire(req).await {
            Ok(Acquire::Granted(g)) => return Ok(g.token),
            other if Instant::now() >= deadline => {
                return Err(format!("not granted within {within:?}: last {other:?}").into())
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_continue_with_one_node_killed() -> TestResult {
    let set = RedisSet::start(3)?;
    let b = open(&format!("{}?node_timeout=300ms&max_ttl=2s", set.url())).await?;
    let req = request("k", "a", Duration::from_secs(2))?;
    let mut last = granted(b.try_acquire(&req).await?)?;
    b.release(&req.lease(last)).await?;
    let held = request("held", "h", Duration::from_secs(2))?;
    // The first node is every race's arbiter: the hardest one to lose.
    for victim in [0, 2, 1] {
        set.kill(victim)?;
        // Waits out the quarantine of the node restarted before.
        let token = acquire_within(&b, &req, Duration::from_secs(10)).await?;
        assert!(token > last, "token {token} after {last}");
        last = token;
        b.release(&req.lease(token)).await?;
        for _ in 0..20 {
            let token = granted(b.try_acquire(&req).await?)?;
            assert!(token > last, "token {token} after {last}");
            last = token;
            let renewed = b.renew(&req.lease(token), Duration::from_secs(2)).await?;
            assert_eq!(renewed.token, token);
            b.release(&req.lease(token)).await?;
        }
        // Back empty, it rejoins in quarantine while the others carry on.
        set.start_again(victim)?;
        let h = acquire_within(&b, &held, Duration::from_secs(5)).await?;
        until_rejoined(
            &set,
            victim,
            &b,
            &request("held", "x", Duration::from_secs(2))?,
        )
        .await?;
        b.release(&held.lease(h)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_neither_votes_in_quarantine_nor_lowers_tokens() -> TestResult {
    let set = RedisSet::start(3)?;
    let url = format!("{}?node_timeout=300ms&max_ttl=4s", set.url());
    let b = open(&url).await?;
    // Form the set with every node up.
    let warm = request("warm", "w", Duration::from_secs(1))?;
    let t = granted(b.try_acquire(&warm).await?)?;
    b.release(&warm.lease(t)).await?;

    // A's lease lives on nodes 1 and 2 only (node 0 is paused), with a
    // token far above the nodes' clocks in µs, so that only the counters
    // and the restarted node's floor, not the clock, can keep the next
    // token above it.
    let floor = FencingToken(1 << 52);
    let a = request("key", "a", Duration::from_secs(3))?.with_min_token(Some(floor));
    set.pause(0)?;
    let token_a = b.try_acquire(&a).await;
    set.resume(0)?;
    let token_a = granted(token_a?)?;
    assert!(token_a > floor);

    // Node 1 crashes and comes back empty. Node 0 is free and node 1
    // remembers nothing: if node 1 voted, B would hold {0, 1}, a majority,
    // while A holds on {1, 2} as far as A can tell.
    set.crash_restart(1)?;
    let b_req = request("key", "b", Duration::from_secs(3))?;
    until_rejoined(&set, 1, &b, &b_req).await?;
    match b.try_acquire(&b_req).await? {
        Acquire::Held(_) => {}
        Acquire::Granted(g) => {
            return Err(format!("B was granted token {} while A holds the key", g.token).into())
        }
    }
    // Node 2, the last one that saw A's token, goes away: the next majority
    // is {0, 1}, where node 0 never saw the token and node 1 lost it.
    set.kill(2)?;
    let token_b = acquire_within(&b, &b_req, Duration::from_secs(15)).await?;
    assert!(
        token_b > token_a,
        "token {token_b} after the restart is not above {token_a}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_is_tolerated_and_a_majority_one_is_refused() -> TestResult {
    let set = RedisSet::start(3)?;
    let direct = open(&set.url()).await?;
    let proxied = ProxiedUrl::start(&format!("{}?node_timeout=300ms", set.url())).await?;
    let b = open(proxied.url()).await?;
    let req = request("p", "a", Duration::from_secs(5))?;
    // Formed while every node is reachable.
    let mut last = granted(b.try_acquire(&req).await?)?;
    b.release(&req.lease(last)).await?;
    for cut in 0..3 {
        proxied.proxies()[cut].controls().partition();
        // Healing the previous cut reset that node's connection: the first
        // request on it may fail while it reconnects.
        let token = acquire_within(&b, &req, Duration::from_secs(5)).await?;
        assert!(token > last);
        last = token;
        b.renew(&req.lease(token), Duration::from_secs(5)).await?;
        b.release(&req.lease(token)).await?;
        proxied.proxies()[cut].controls().heal();
    }
    // Cut from two nodes of three: no grant, and nothing held afterwards.
    proxied.proxies()[0].controls().partition();
    proxied.proxies()[2].controls().partition();
    let refused = b.try_acquire(&req).await;
    assert!(
        matches!(&refused, Err(e) if e.is_transient()),
        "a client reaching one node of three got {refused:?}"
    );
    let other = request("p", "other", Duration::from_secs(5))?;
    let token = granted(direct.try_acquire(&other).await?)?;
    assert!(token > last);
    Ok(())
}
