//! Redlock under node faults: a killed node, a node restarted empty
//! (quarantine and token floor), a majority restarted empty (re-formation
//! after the quarantine), every node restarted empty, and minority
//! partitions.
//!
//! Time: every test runs against real `redis-server`s, whose clocks end
//! leases and quarantines, so none can run on tokio's paused clock. Each
//! measures a [`Patience`] against its nodes first (scheduling delay and a
//! round trip to node 0) and takes every TTL, `max_ttl`, `node_timeout`,
//! `connect_timeout`, simulated latency that a bound is compared with, wait
//! and deadline from a base figure (what a quiet machine needs, with the
//! margins the test always had) times its factor; the base figure is the
//! floor. A bound that tells a fault from its absence (a dead node waited
//! for, a connection opened inside a request) scales with the figure it is
//! compared to, so it tells them apart on a busy machine too. Failures name
//! the patience.

use std::time::Duration;

use fencelock_core::{Acquire, AcquireRequest, Backend, FencingToken, LockKey, Owner};
use fencelock_redlock::{RedlockBackend, RedlockOptions};
use fencelock_testkit::{
    patience::ms,
    proxy::{Direction, ProxiedUrl},
    servers::redis_set::RedisSet,
    Patience, TestResult,
};
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

/// The budget of a test against `set`: the machine's scheduling delay and
/// the worst round trip to node 0, measured while every node answers.
async fn patience(set: &RedisSet) -> TestResult<Patience> {
    let conn = node_conn(set, 0).await?;
    Ok(Patience::with_round_trip(|| {
        let mut conn = conn.clone();
        async move {
            // A failed PING is a round trip too.
            let _ = redis::cmd("PING").query_async::<()>(&mut conn).await;
        }
    })
    .await)
}

/// `set`'s URL with each node given `node_timeout` and leases at most
/// `max_ttl`, both as scaled figures.
fn set_url(set: &RedisSet, node_timeout: Duration, max_ttl: Duration) -> String {
    format!(
        "{}?node_timeout={}&max_ttl={}",
        set.url(),
        ms(node_timeout),
        ms(max_ttl)
    )
}

/// A backend over [`set_url`].
async fn open_set(
    set: &RedisSet,
    node_timeout: Duration,
    max_ttl: Duration,
) -> TestResult<RedlockBackend> {
    open(&set_url(set, node_timeout, max_ttl)).await
}

/// Whether node `i` of `set` is formed (its redlock marker has
/// `votes_from`), read with a plain connection.
async fn formed(set: &RedisSet, i: usize) -> TestResult<bool> {
    let client = redis::Client::open(set.node_url(i))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let exists: i64 = redis::cmd("HEXISTS")
        .arg("fencelock:redlock")
        .arg("votes_from")
        .query_async(&mut conn)
        .await?;
    Ok(exists == 1)
}

/// A restarted node's quarantine for `max_ttl` (docs/redlock.md).
fn quarantine(max_ttl: Duration) -> Duration {
    max_ttl + max_ttl / 100 + Duration::from_millis(2)
}

/// Retries `try_acquire` until it is granted, failing if that happens
/// before `not_before` or not by `deadline`; returns the token and when
/// the grant was answered.
async fn first_grant(
    b: &RedlockBackend,
    req: &AcquireRequest,
    not_before: Instant,
    deadline: Instant,
    p: Patience,
) -> TestResult<(FencingToken, Instant)> {
    loop {
        let answer = b.try_acquire(req).await;
        let now = Instant::now();
        match answer {
            Ok(Acquire::Granted(g)) if now < not_before => {
                return Err(format!(
                    "granted token {} {:?} before a lease that may still live ends ({p})",
                    g.token,
                    not_before - now
                )
                .into())
            }
            Ok(Acquire::Granted(g)) => return Ok((g.token, now)),
            other if now >= deadline => {
                return Err(format!("not granted by the deadline: last {other:?} ({p})").into())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Runs `attempt` (which must never grant) until node `i` has rejoined,
/// within a base of 10 s.
async fn until_rejoined(
    set: &RedisSet,
    i: usize,
    b: &RedlockBackend,
    req: &AcquireRequest,
    p: Patience,
) -> TestResult {
    let deadline = Instant::now() + p.bound(Duration::from_secs(10));
    while !formed(set, i).await? {
        if let Ok(Acquire::Granted(g)) = b.try_acquire(req).await {
            return Err(format!("granted token {} while the key is held ({p})", g.token).into());
        }
        if Instant::now() >= deadline {
            return Err(format!("node {i} never rejoined ({p})").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Retries `try_acquire` until it is granted or `within` (a base figure,
/// scaled by `p`) has passed.
async fn acquire_within(
    b: &RedlockBackend,
    req: &AcquireRequest,
    within: Duration,
    p: Patience,
) -> TestResult<FencingToken> {
    let within = p.bound(within);
    let deadline = Instant::now() + within;
    loop {
        match b.try_acquire(req).await {
            Ok(Acquire::Granted(g)) => return Ok(g.token),
            other if Instant::now() >= deadline => {
                return Err(format!("not granted within {within:?}: last {other:?} ({p})").into())
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_continue_with_one_node_killed() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    // With a node dead every grant needs both others within node_timeout.
    let ttl = p.ttl(Duration::from_secs(2));
    let node_timeout = p.bound(Duration::from_millis(300));
    let b = open_set(&set, node_timeout, ttl).await?;
    let req = request("k", "a", ttl)?;
    let mut last = granted(b.try_acquire(&req).await?)?;
    b.release(&req.lease(last)).await?;
    let held = request("held", "h", ttl)?;
    // The first node is every race's arbiter: the hardest one to lose.
    for victim in [0, 2, 1] {
        set.kill(victim)?;
        // Waits out the quarantine of the node restarted before.
        let token = acquire_within(&b, &req, Duration::from_secs(10), p).await?;
        assert!(token > last, "token {token} after {last}");
        last = token;
        b.release(&req.lease(token)).await?;
        for round in 0..20 {
            let token = granted(b.try_acquire(&req).await?)
                .map_err(|e| format!("node {victim} dead, round {round}: {e} ({p})"))?;
            assert!(token > last, "token {token} after {last}");
            last = token;
            let renewed = b.renew(&req.lease(token), ttl).await?;
            assert_eq!(renewed.token, token);
            b.release(&req.lease(token)).await?;
        }
        // Back empty, it rejoins in quarantine while the others carry on.
        set.start_again(victim)?;
        let h = acquire_within(&b, &held, Duration::from_secs(5), p).await?;
        until_rejoined(&set, victim, &b, &request("held", "x", ttl)?, p).await?;
        b.release(&held.lease(h)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_neither_votes_in_quarantine_nor_lowers_tokens() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let url = set_url(
        &set,
        p.bound(Duration::from_millis(300)),
        p.ttl(Duration::from_secs(4)),
    );
    let b = open(&url).await?;
    // A's lease must outlive node 1's restart and rejoin, and B's try.
    let ttl = p.ttl(Duration::from_secs(3));
    // Form the set with every node up.
    let warm = request("warm", "w", p.ttl(Duration::from_secs(1)))?;
    let t = granted(b.try_acquire(&warm).await?)?;
    b.release(&warm.lease(t)).await?;

    // A's lease lives on nodes 1 and 2 only (node 0 is paused), with a
    // token far above the nodes' clocks in µs, so that only the counters
    // and the restarted node's floor, not the clock, can keep the next
    // token above it.
    let floor = FencingToken(1 << 52);
    let a = request("key", "a", ttl)?.with_min_token(Some(floor));
    set.pause(0)?;
    let token_a = b.try_acquire(&a).await;
    set.resume(0)?;
    let token_a = granted(token_a?)?;
    assert!(token_a > floor);

    // Node 1 crashes and comes back empty. Node 0 is free and node 1
    // remembers nothing: if node 1 voted, B would hold {0, 1}, a majority,
    // while A holds on {1, 2} as far as A can tell.
    set.crash_restart(1)?;
    let b_req = request("key", "b", ttl)?;
    until_rejoined(&set, 1, &b, &b_req, p).await?;
    match b.try_acquire(&b_req).await? {
        Acquire::Held(_) => {}
        Acquire::Granted(g) => {
            return Err(format!(
                "B was granted token {} while A holds the key ({p})",
                g.token
            )
            .into())
        }
    }
    // Node 2, the last one that saw A's token, goes away: the next majority
    // is {0, 1}, where node 0 never saw the token and node 1 lost it.
    set.kill(2)?;
    let token_b = acquire_within(&b, &b_req, Duration::from_secs(15), p).await?;
    assert!(
        token_b > token_a,
        "token {token_b} after the restart is not above {token_a}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_is_tolerated_and_a_majority_one_is_refused() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let ttl = p.ttl(Duration::from_secs(5));
    let direct = open(&format!("{}?max_ttl={}", set.url(), ms(ttl))).await?;
    let proxied = ProxiedUrl::start(&set_url(&set, p.bound(Duration::from_secs(1)), ttl)).await?;
    let b = open(proxied.url()).await?;
    let req = request("p", "a", ttl)?;
    // Formed while every node is reachable.
    let mut last = granted(b.try_acquire(&req).await?)?;
    b.release(&req.lease(last)).await?;
    for cut in 0..3 {
        proxied.proxies()[cut].controls().partition();
        // Healing the previous cut reset that node's connection: the first
        // request on it may fail while it reconnects.
        let token = acquire_within(&b, &req, Duration::from_secs(5), p).await?;
        assert!(token > last);
        last = token;
        b.renew(&req.lease(token), ttl).await?;
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
    let other = request("p", "other", ttl)?;
    let token = granted(direct.try_acquire(&other).await?)?;
    assert!(token > last);
    Ok(())
}

/// The issue "Redlock does not recover when a majority restarts empty":
/// two nodes of three restarted without persistence used to leave one
/// formed node, which could never vouch for a rejoin alone, and the set
/// refused forever. Now the empty majority re-forms once every node
/// answers and votes a quarantine after it was found empty; nothing is
/// granted while the lease the restarted nodes forgot could still live,
/// and tokens stay above every earlier one: the one only the lost nodes
/// knew (below their clocks) and one far above the clocks that only the
/// surviving node remembers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_restarted_empty_forms_again_after_the_quarantine() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let max_ttl = p.ttl(Duration::from_secs(2));
    let short = p.ttl(Duration::from_secs(1));
    let options = format!(
        "node_timeout={}&max_ttl={}",
        ms(p.bound(Duration::from_millis(300))),
        ms(max_ttl)
    );
    let b = open(&format!("{}?{options}", set.url())).await?;
    // A second client whose way to node 0 can be cut without pausing the
    // node (a paused node would still run the grant it received on resume).
    let proxied = ProxiedUrl::start(&format!("{}?{options}", set.url())).await?;
    let cut = open(proxied.url()).await?;

    // Every node grants and remembers (in its high-water mark) a token far
    // above the clocks in µs: after the restart only node 0 knows it.
    let high = request("high", "h", short)?.with_min_token(Some(FencingToken(1 << 52)));
    let token_high = granted(b.try_acquire(&high).await?)?;
    b.release(&high.lease(token_high)).await?;
    let warm = request("key", "w", short)?;
    let token_warm = granted(cut.try_acquire(&warm).await?)?;
    cut.release(&warm.lease(token_warm)).await?;

    // A holds the key on nodes 1 and 2 only, for the longest TTL: once
    // they restart, no node knows A's lease or its token.
    let a = request("key", "a", max_ttl)?;
    proxied.proxies()[0].controls().partition();
    let a_sent = Instant::now();
    let token_a = cut.try_acquire(&a).await;
    proxied.proxies()[0].controls().heal();
    let token_a = granted(token_a?)?;
    assert!(token_a > token_warm);

    set.crash_restart(1)?;
    set.crash_restart(2)?;
    let restarted = Instant::now();
    // Node 0 is free and nodes 1 and 2 forgot A: voting at once, any two
    // would grant B while A's lease lives (until a_sent + max_ttl at the
    // earliest). The documented bound: a quarantine after the first
    // attempt that reaches every node (this one), plus slack for a loaded
    // machine.
    let b_req = request("key", "b", max_ttl)?;
    let deadline = restarted + quarantine(max_ttl) + p.bound(Duration::from_secs(3));
    let (token_b, _) = first_grant(&b, &b_req, a_sent + max_ttl, deadline, p).await?;
    assert!(formed(&set, 1).await? && formed(&set, 2).await?);
    assert!(
        token_b > token_a,
        "token {token_b} after the restart is not above {token_a}"
    );
    b.release(&b_req.lease(token_b)).await?;

    // A majority that leaves node 0 out: only the restarted nodes' floor,
    // taken from node 0's high-water mark, keeps the token above 2^52.
    proxied.proxies()[0].controls().partition();
    // (The two restarted nodes were found empty in one round, so the
    // second may vote a moment after the first: retry briefly.)
    let again = acquire_within(
        &cut,
        &request("high", "h2", short)?,
        Duration::from_secs(3),
        p,
    )
    .await;
    proxied.proxies()[0].controls().heal();
    let token_again = again?;
    assert!(
        token_again > token_high,
        "token {token_again} on the re-formed nodes is not above {token_high}"
    );
    Ok(())
}

/// A majority that answers empty re-forms only when every node answers:
/// the one that does not may be formed and remember tokens the others
/// lost. Once it answers, the set grants again a quarantine later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_restarted_empty_waits_for_every_node_to_answer() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let max_ttl = p.ttl(Duration::from_secs(1));
    let b = open_set(&set, p.bound(Duration::from_millis(300)), max_ttl).await?;
    let high = request("key", "h", max_ttl)?.with_min_token(Some(FencingToken(1 << 52)));
    let token_high = granted(b.try_acquire(&high).await?)?;
    b.release(&high.lease(token_high)).await?;

    set.pause(0)?;
    set.crash_restart(1)?;
    set.crash_restart(2)?;
    let req = request("key", "b", max_ttl)?;
    let found_empty = Instant::now();
    // Past the quarantine, with node 0 silent: nothing re-forms.
    while found_empty.elapsed() < quarantine(max_ttl) + Duration::from_millis(500) {
        if let Ok(Acquire::Granted(g)) = b.try_acquire(&req).await {
            return Err(format!("granted token {} without node 0's answer ({p})", g.token).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!formed(&set, 1).await? && !formed(&set, 2).await?);
    set.resume(0)?;
    let resumed = Instant::now();
    let deadline = resumed + quarantine(max_ttl) + p.bound(Duration::from_secs(3));
    let (token, _) = first_grant(&b, &req, resumed, deadline, p).await?;
    assert!(
        token > token_high,
        "token {token} is not above {token_high}, which node 0 remembered"
    );
    Ok(())
}

/// Every node restarted empty looks like a new set: it forms at once, and
/// tokens continue from the nodes' clocks in µs, above the earlier ones
/// (which were drawn from the same clocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_restarted_empty_forms_anew_with_tokens_from_the_clocks() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let ttl = p.ttl(Duration::from_secs(2));
    let b = open_set(&set, p.bound(Duration::from_millis(300)), ttl).await?;
    let req = request("key", "a", ttl)?;
    let before = granted(b.try_acquire(&req).await?)?;
    for i in 0..3 {
        set.crash_restart(i)?;
    }
    let after = acquire_within(&b, &req, Duration::from_secs(5), p).await?;
    assert!(
        after > before,
        "token {after} after the restart, {before} before"
    );
    Ok(())
}

/// A node that lost its data joins in quarantine even a formed majority
/// that has never granted anything: a grant the node made before it lost
/// its data may still complete on that majority, whose copies then make
/// a lease that the node, voting at once, would grant again (the
/// counterexample of the planted bug `fresh-join`, docs/safety.md).
///
/// The quarantine is read off node 0's marker as `votes_from - born` (both
/// written by the join, on node 0's clock), not against the clock when the
/// test gets to read it, so no delay between the join and the read can
/// shorten it. The join may miss any one acquisition (node 0 answers after
/// the formed majority, or after its request's bound): the test keeps
/// acquiring until node 0 has joined, each acquisition being a chance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_data_joins_a_majority_that_never_granted_in_quarantine() -> TestResult
{
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let max_ttl = p.ttl(Duration::from_secs(2));
    // Nodes 1 and 2 formed as a new set and granted nothing (the marker
    // the join script's `fresh` mode writes); node 0 is empty.
    for i in [1, 2] {
        let mut conn = node_conn(&set, i).await?;
        let (now_ms, now_us) = node_time(&mut conn).await?;
        redis::cmd("HSET")
            .arg("fencelock:redlock")
            .arg("votes_from")
            .arg(now_ms)
            .arg("floor")
            .arg(now_us)
            .arg("hwm")
            .arg(0)
            .arg("born")
            .arg(now_ms)
            .query_async::<()>(&mut conn)
            .await?;
    }
    let b = open_set(&set, p.bound(Duration::from_millis(300)), max_ttl).await?;
    // Nodes 1 and 2 grant; node 0 joins on the way, or, if its answer came
    // after the majority's, in the background or at a later acquisition.
    let ttl = p.ttl(Duration::from_secs(1));
    granted(b.try_acquire(&request("key", "b", ttl)?).await?)?;
    let bound = p.bound(Duration::from_secs(5));
    let deadline = Instant::now() + bound;
    let other = request("other", "c", ttl)?;
    while !formed(&set, 0).await? {
        if Instant::now() >= deadline {
            return Err(format!("node 0 did not join within {bound:?} of the grant ({p})").into());
        }
        // Nodes 1 and 2 vote; node 0, asked too, answers unformed, which
        // sends a probe that joins it.
        if let Ok(Acquire::Granted(g)) = b.try_acquire(&other).await {
            b.release(&other.lease(g.token)).await?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut conn = node_conn(&set, 0).await?;
    let (votes_from, born): (i64, i64) = redis::cmd("HMGET")
        .arg("fencelock:redlock")
        .arg("votes_from")
        .arg("born")
        .query_async(&mut conn)
        .await?;
    // The join's own quarantine: max_ttl + 1 % + 2 ms after it ran; none
    // (votes_from == born) for a node that joined as a new set.
    let quarantined = Duration::from_millis(u64::try_from(votes_from - born).unwrap_or(0));
    assert!(
        quarantined >= max_ttl,
        "node 0 votes {quarantined:?} after it joined, not after max_ttl {max_ttl:?}: it joined \
         without quarantine ({p})"
    );
    Ok(())
}

/// A node's clock: (ms, µs).
async fn node_time(conn: &mut redis::aio::MultiplexedConnection) -> TestResult<(i64, i64)> {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    let now_us = s * 1_000_000 + us;
    Ok((now_us / 1000, now_us))
}

/// A plain connection to node `i` of `set`.
async fn node_conn(set: &RedisSet, i: usize) -> TestResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(set.node_url(i))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// The owner of `key`'s lease copy on node `i`, if it has one.
async fn copy_owner(set: &RedisSet, i: usize, key: &str) -> TestResult<Option<String>> {
    let owner: Option<String> = redis::cmd("HGET")
        .arg(format!("fencelock:{{{key}}}"))
        .arg("owner")
        .query_async(&mut node_conn(set, i).await?)
        .await?;
    Ok(owner)
}

/// Writes a lease copy of `owner` for `key` on node `i` by hand, as a
/// failed acquisition whose undo was lost leaves one.
async fn plant_copy(set: &RedisSet, i: usize, key: &str, owner: &str) -> TestResult {
    let name = format!("fencelock:{{{key}}}");
    let mut conn = node_conn(set, i).await?;
    redis::pipe()
        .cmd("HSET")
        .arg(&name)
        .arg("owner")
        .arg(owner)
        .arg("token")
        .arg("1")
        .ignore()
        .cmd("PEXPIRE")
        .arg(&name)
        .arg(120_000)
        .ignore()
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// How the nodes of [`dead_nodes_cost_no_node_timeout`] die.
#[derive(Clone, Copy)]
enum Death {
    /// kill -9: connections reset, the port refuses.
    Killed,
    /// SIGSTOP: nothing answers, every request waits for `node_timeout`.
    Silent,
}

/// `dead` of `n` nodes die. Each round then asks `try_acquire` for a key
/// whose fate the living nodes cannot settle without the dead ones: the
/// first living node holds a stray copy of another owner's and the others
/// grant, one short of a majority. Waiting for the dead nodes would cost
/// `node_timeout` (a base of 10 s) every round; once they have failed a
/// request they are skipped, so after the first round, ten rounds and ten
/// ordinary cycles take less than one `node_timeout` together. Both scale
/// with the patience: the rounds' round trips on a busy machine, the
/// node_timeout they are compared with by the same factor.
async fn dead_nodes_cost_no_node_timeout(n: usize, dead: &[usize], death: Death) -> TestResult {
    let set = RedisSet::start(n)?;
    let p = patience(&set).await?;
    let node_timeout = p.bound(Duration::from_secs(10));
    let ttl = p.ttl(Duration::from_secs(5));
    let b = open_set(&set, node_timeout, ttl).await?;
    let warm = request("warm", "w", ttl)?;
    let mut last = granted(b.try_acquire(&warm).await?)?;
    b.release(&warm.lease(last)).await?;
    let first_alive = (0..n).find(|i| !dead.contains(i)).ok_or("no node left")?;
    plant_copy(&set, first_alive, "split", "x").await?;
    for &i in dead {
        match death {
            Death::Killed => set.kill(i)?,
            Death::Silent => set.pause(i)?,
        }
    }
    let split = request("split", "a", ttl)?;
    let cycle = request("cycle", "a", ttl)?;
    // The first round finds the dead nodes dead (at most node_timeout).
    let first = b.try_acquire(&split).await?;
    assert!(matches!(first, Acquire::Held(_)), "{first:?}");
    let started = Instant::now();
    for _ in 0..10 {
        match b.try_acquire(&split).await? {
            Acquire::Held(_) => {}
            other => return Err(format!("the split key was answered {other:?}").into()),
        }
        let token = granted(b.try_acquire(&cycle).await?)?;
        assert!(token > last, "token {token} after {last}");
        last = token;
        b.renew(&cycle.lease(token), ttl).await?;
        b.release(&cycle.lease(token)).await?;
    }
    let took = started.elapsed();
    assert!(
        took < node_timeout,
        "ten rounds with {dead:?} of {n} dead took {took:?}, more than node_timeout \
         {node_timeout:?}: a dead node was waited for ({p})"
    );
    if matches!(death, Death::Silent) {
        for &i in dead {
            set.resume(i)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_killed_node_of_three_costs_no_node_timeout_after_the_first() -> TestResult {
    dead_nodes_cost_no_node_timeout(3, &[0], Death::Killed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_killed_nodes_of_five_cost_no_node_timeout_after_the_first() -> TestResult {
    dead_nodes_cost_no_node_timeout(5, &[0, 3], Death::Killed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_costs_no_node_timeout_after_the_first() -> TestResult {
    dead_nodes_cost_no_node_timeout(3, &[0], Death::Silent).await
}

/// An acquisition that fails before a slow node answers leaves that node's
/// grant behind it; the grant is undone as soon as its answer arrives,
/// long before its lease would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_is_undone() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    // The undo must come well within the lease, so that its end cannot
    // pass for the undo: a deadline of a quarter of the TTL.
    let ttl = p.ttl(Duration::from_secs(60));
    let within = p.bound(Duration::from_secs(15));
    // Node 2's way: long enough that the attempt ends, and the test reads
    // node 2, before the grant lands there on a busy machine too.
    let one_way = p.bound(Duration::from_secs(1));
    let proxied = ProxiedUrl::start(&set_url(&set, p.bound(Duration::from_secs(10)), ttl)).await?;
    let b = open(proxied.url()).await?;
    let warm = request("warm", "w", p.ttl(Duration::from_secs(5)))?;
    let t = granted(b.try_acquire(&warm).await?)?;
    b.release(&warm.lease(t)).await?;
    // Another owner holds the key on nodes 0 and 1: a majority, so the
    // answer is known before node 2, `one_way` away each way, answers.
    plant_copy(&set, 0, "late", "x").await?;
    plant_copy(&set, 1, "late", "x").await?;
    proxied.proxies()[2]
        .controls()
        .set_latency(Direction::Both, one_way, Duration::ZERO);
    let asked = Instant::now();
    match b.try_acquire(&request("late", "a", ttl)?).await? {
        Acquire::Held(Some(holder)) => assert_eq!(holder.owner.as_str(), "x"),
        other => return Err(format!("expected x to hold the key, got {other:?}").into()),
    }
    assert!(
        copy_owner(&set, 2, "late").await?.is_none(),
        "node 2 answered before the attempt ended ({:?} after it began): the grant was not \
         late ({p})",
        asked.elapsed()
    );
    // The grant lands on node 2, then goes.
    let deadline = asked + within;
    let mut landed = false;
    loop {
        let owner = copy_owner(&set, 2, "late").await?;
        match (landed, owner.as_deref()) {
            (false, Some("a")) => landed = true,
            (true, None) => break,
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "node 2's late grant {} within {within:?} of a {ttl:?} lease ({p})",
                if landed {
                    "was not undone"
                } else {
                    "never landed"
                }
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Opening a node takes several round trips (the connection, the scripts,
/// the pub/sub connection), a request one. On a link where opening takes
/// longer than `node_timeout` and a request does not, the backend opens
/// (waiting up to `connect_timeout`) and grants. So does a backend that
/// never ran `connect`: its requests stop waiting for the nodes' opening,
/// which carries on until a later request finds the nodes open. Bounding
/// opening by `node_timeout` failed both every time. The latency and
/// `node_timeout` scale together, so that one round trip fits and opening
/// does not on a busy machine too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_open_slower_than_node_timeout_are_used() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let ttl = p.ttl(Duration::from_secs(5));
    let proxied =
        ProxiedUrl::start(&set_url(&set, p.bound(Duration::from_millis(700)), ttl)).await?;
    // Every reply a base of 300 ms late: one round trip fits in
    // node_timeout, the three or more of opening do not.
    proxied.set_latency(
        Direction::ToClient,
        p.bound(Duration::from_millis(300)),
        Duration::ZERO,
    );
    let req = request("slow", "a", ttl)?;
    let b = open(proxied.url()).await?;
    let token = acquire_within(&b, &req, Duration::from_secs(10), p).await?;
    b.release(&req.lease(token)).await?;
    let lazy = RedlockBackend::new(RedlockOptions::from_url(proxied.url())?);
    let again = acquire_within(&lazy, &req, Duration::from_secs(10), p).await?;
    assert!(again > token, "token {again} after {token}");
    lazy.release(&req.lease(again)).await?;
    Ok(())
}

/// A node killed and started again (with its data: persistent) is skipped
/// while it is down, then asked again: leases reach it once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_comes_back_is_used_again() -> TestResult {
    let set = RedisSet::start_persistent(3)?;
    let p = patience(&set).await?;
    let ttl = p.ttl(Duration::from_secs(5));
    let b = open_set(&set, p.bound(Duration::from_millis(300)), ttl).await?;
    let req = request("back", "a", ttl)?;
    let mut last = granted(b.try_acquire(&req).await?)?;
    b.release(&req.lease(last)).await?;
    set.kill(0)?;
    for _ in 0..20 {
        // With node 0 dead every grant needs both others within
        // node_timeout, which a loaded machine's fsync (AOF `always`) can
        // miss once; what this test is about comes after the restart.
        let token = acquire_within(&b, &req, Duration::from_secs(10), p).await?;
        assert!(token > last, "token {token} after {last}");
        last = token;
        b.release(&req.lease(token)).await?;
    }
    set.start_again(0)?;
    let deadline = Instant::now() + p.bound(Duration::from_secs(15));
    loop {
        // Until node 0 answers in time, a release may miss it: its copy
        // then refuses the next attempt (node 0 votes first) unless both
        // other nodes grant in time.
        let token = acquire_within(&b, &req, Duration::from_secs(5), p).await?;
        assert!(token > last, "token {token} after {last}");
        last = token;
        // Node 0 may answer after the majority did.
        let seen = Instant::now() + p.bound(Duration::from_millis(500));
        let mut used = false;
        while !used && Instant::now() < seen {
            used = copy_owner(&set, 0, "back").await?.as_deref() == Some("a");
            if !used {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        b.release(&req.lease(token)).await?;
        if used {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("node 0 was never asked again after it came back ({p})").into());
        }
    }
}

/// A node whose round trip (400 ms) is above `node_timeout` (the default
/// 250 ms) but well within a third of the TTL (a base of 1 s) is a vote
/// like any other, as a node in a far data centre is: a fresh set forms
/// with it, and with a near node killed it still makes the majority, for
/// grants and renewals alike. Bounded by `node_timeout` alone, its every
/// request timed out: the set never formed, and once formed, the far node
/// was skipped, so that one more dead node stopped every grant. Only the
/// TTL scales: a busy machine lengthens the far node's round trip, which
/// stays above the default `node_timeout` under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_node_within_a_third_of_the_ttl_is_never_skipped() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let ttl = p.ttl(Duration::from_secs(3));
    let proxied = ProxiedUrl::start(&format!(
        "{}?max_ttl={}",
        set.url(),
        ms(p.ttl(Duration::from_secs(10)))
    ))
    .await?;
    proxied.proxies()[2].controls().set_latency(
        Direction::Both,
        Duration::from_millis(200),
        Duration::ZERO,
    );
    let b = open(proxied.url()).await?;
    // Forming a fresh set needs every node's answer, the far one's too.
    let first = request("far", "a", ttl)?;
    let token = granted(b.try_acquire(&first).await?)?;
    assert!(formed(&set, 2).await?, "the far node was not formed ({p})");
    set.kill(0)?;
    // Nodes 1 and 2 are the only majority left.
    b.renew(&first.lease(token), ttl).await?;
    b.release(&first.lease(token)).await?;
    let mut last = token;
    for round in 0..5 {
        let next = request(&format!("far-{round}"), "a", ttl)?;
        let t = granted(b.try_acquire(&next).await?)
            .map_err(|e| format!("round {round} with node 0 dead: {e} ({p})"))?;
        assert!(t > last, "token {t} after {last}");
        last = t;
        b.renew(&next.lease(t), ttl).await?;
        b.release(&next.lease(t)).await?;
    }
    Ok(())
}

/// A waiter subscribes on every node and is woken by the release itself
/// (each node publishes the release it applies), not by its next poll:
/// across data centres a poll's back-off costs round trips on top of the
/// one a hand-off needs. With a node dead the others still tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiters_through_the_nodes() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    let holder = open(&set.url()).await?;
    let waiter = open(&set.url()).await?;
    let ttl = Duration::from_secs(30);
    for round in 0..2 {
        let req = request("woken", "holder", ttl)?;
        let token = granted(holder.try_acquire(&req).await?)?;
        let mut wake = waiter
            .subscribe(&LockKey::new("woken")?)
            .await?
            .ok_or("redlock offers no wake-ups")?;
        holder.release(&req.lease(token)).await?;
        let woken = tokio::time::timeout(p.bound(Duration::from_secs(10)), wake.woken()).await;
        assert_eq!(
            woken,
            Ok(true),
            "round {round}: the release woke nobody ({p})"
        );
        // The second round with node 0 dead.
        set.kill(0)?;
    }
    Ok(())
}

/// A new client's first acquisition with one node stopped (SIGSTOP: its
/// port accepts connections and nothing answers) is decided by the two
/// others: its probe ends once a majority of formed nodes answered. It
/// used to wait for the stopped node's connection to open, up to the TTL
/// (at most `connect_timeout`), so every new process lost that long (the
/// availability scorecard's `redlock / stop` window, docs/faults.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_does_not_wait_for_a_stopped_node() -> TestResult {
    let set = RedisSet::start(3)?;
    let p = patience(&set).await?;
    // connect_timeout (a base of 5 s) stays below the TTL (10 s): the
    // request waits for a connection still opening up to the shorter.
    let ttl = p.ttl(Duration::from_secs(10));
    let url = format!(
        "{}?max_ttl={}&connect_timeout={}",
        set.url(),
        ms(ttl),
        ms(p.bound(Duration::from_secs(5)))
    );
    // Forms the set while every node answers.
    let first = open(&url).await?;
    let token = granted(first.try_acquire(&request("warm", "a", ttl)?).await?)?;
    first
        .release(&request("warm", "a", ttl)?.lease(token))
        .await?;
    set.pause(0)?;
    let started = Instant::now();
    let fresh = open(&url).await?;
    let answer = fresh.try_acquire(&request("key", "b", ttl)?).await;
    let took = started.elapsed();
    set.resume(0)?;
    granted(answer?)?;
    // The stopped node's connection would have been waited for
    // `connect_timeout`, below the TTL; half of that is ample for two
    // local round trips on this machine now.
    let bound = RedlockOptions::from_url(&url)?.connect_timeout / 2;
    assert!(
        took < bound,
        "granted after {took:?}, not within {bound:?} ({p})"
    );
    Ok(())
}
