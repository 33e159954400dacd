//! What a Redis Cluster changes, beyond the conformance suite: a renewal
//! batch over keys of every primary (split by slot, answered in order,
//! `WAIT` on each slot's primary), the `timeout` option against a silent
//! seed and a paused primary, a paused primary's slots followed to the
//! replica that replaced it, `release_all` visiting every primary, and
//! wake-ups that survive the death of the node the pub/sub connection was
//! on.
//!
//! Time: a real cluster, so no paused clock. Each test measures a
//! [`Patience`] against the cluster first and scales from base figures
//! every `timeout` and `wait_timeout` in its URLs, every TTL a failover or
//! a stopped primary must not outlast, and every wait and bound (the
//! bounds a stopped primary must fail within follow the timeouts they
//! check); failures name the patience. TTLs of 30 s and more that only
//! have to outlive a few requests are left as they are.

use std::time::Duration;

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, Error, LeaseId, LockKey, Owner, Renewal,
};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis_cluster::RedisCluster, Patience, TestResult};

use crate::ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_every_primary_is_answered_in_order() -> TestResult {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await??;
    let p = crate::patience(&cluster.url()).await?;
    // With `WAIT` for the replica of each primary written: after each
    // acquire on the key's primary, and once per slot of the batch.
    let backend = RedisBackend::connect(&format!(
        "{}?prefix=batch&wait_replicas=1&wait_timeout={}",
        cluster.url(),
        ms(p.bound(Duration::from_secs(5)))
    ))
    .await?;
    let owner = Owner::new("batch")?;
    let mut leases = Vec::new();
    let mut primaries = Vec::new();
    for i in 0..30 {
        let key = LockKey::new(format!("batch-{i}"))?;
        primaries.push(cluster.primary_of(cluster.keyslot(&format!("batch:{{{key}}}"))?)?);
        let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
        let Acquire::Granted(g) = backend.try_acquire(&request).await? else {
            return Err(format!("{key} was not free").into());
        };
        leases.push(LeaseId::new(key, owner.clone(), g.token));
    }
    primaries.sort_unstable();
    primaries.dedup();
    assert_eq!(primaries.len(), 3, "the keys span every primary");
    // One lease the backend never granted, in the middle of the batch.
    let stale = LeaseId::new(
        leases[7].key.clone(),
        owner.clone(),
        fencelock_core::FencingToken(leases[7].token.0 + 1),
    );
    let mut renewals: Vec<Renewal> = leases
        .iter()
        .map(|l| Renewal::new(l.clone(), Duration::from_secs(60)))
        .collect();
    renewals.insert(8, Renewal::new(stale, Duration::from_secs(60)));
    let answers = backend.renew_many(&renewals).await?;
    assert_eq!(answers.len(), renewals.len());
    for (i, answer) in answers.iter().enumerate() {
        match (i, answer) {
            (8, Err(Error::NotHeld { .. })) => {}
            (8, other) => return Err(format!("the stale lease got {other:?}").into()),
            (_, Ok(g)) => assert_eq!(g.token, renewals[i].lease.token, "answer {i}"),
            (_, Err(e)) => return Err(format!("renewal {i}: {e} ({p})").into()),
        }
    }
    assert_eq!(backend.list(None).await?.len(), 30);
    assert_eq!(backend.release_all(&owner).await?, 30);
    assert!(backend.list(None).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_move_to_another_node_when_theirs_dies() -> TestResult {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await??;
    let primaries = cluster.primaries()?;
    let replica = cluster
        .ports()
        .into_iter()
        .find(|p| !primaries.contains(p))
        .ok_or("no replica")?;
    // The waiter's pub/sub connection goes to the first listed node: a
    // replica, which can die without taking slots with it.
    let mut nodes = vec![replica];
    nodes.extend(cluster.ports().into_iter().filter(|&p| p != replica));
    let listed: Vec<String> = nodes.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let waiter = RedisBackend::connect(&format!("redis+cluster://{}", listed.join(","))).await?;
    let holder = RedisBackend::connect(&cluster.url()).await?;
    let p = Patience::against(&holder).await;

    let key = LockKey::new("moving")?;
    let owner = Owner::new("holder")?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
    let Acquire::Granted(grant) = holder.try_acquire(&request).await? else {
        return Err("free key not granted".into());
    };
    cluster.kill(replica)?;

    // The reader notices the dead connection and reconnects to the next
    // listed node; until then subscribing fails transiently.
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(30));
    let mut subscription = loop {
        match waiter.subscribe(&key).await {
            Ok(Some(s)) => break s,
            Ok(None) => return Err("redis offers wake-ups".into()),
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                // Bounded retry while the reader reconnects.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("subscribing after the kill: {e} ({p})").into()),
        }
    };
    holder
        .release(&LeaseId::new(key.clone(), owner, grant.token))
        .await?;
    // The release is published on the key's primary and broadcast to every
    // node, the one the waiter now listens on included.
    let woken = tokio::time::timeout(p.bound(Duration::from_secs(10)), subscription.woken()).await;
    assert_eq!(woken.ok(), Some(true), "the waiter was not woken ({p})");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_seed_or_primary_fails_within_the_timeout() -> TestResult {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await??;
    let p = crate::patience(&cluster.url()).await?;
    let timeout = p.bound(Duration::from_secs(1));
    fencelock_testkit::timeouts::connecting_to_a_silent_server_fails_in_time(
        timeout,
        |port| format!("redis+cluster://127.0.0.1:{port}?timeout={}", ms(timeout)),
        |url| async move { RedisBackend::connect(&url).await },
    )
    .await
    .map_err(|e| format!("{e} ({p})"))?;

    // A primary that stops answering (SIGSTOP) without closing its
    // connections: a command for its slot fails transiently within the
    // timeout, whatever the cluster client retries meanwhile.
    let backend = RedisBackend::connect(&format!(
        "{}?prefix=silent&timeout={}",
        cluster.url(),
        ms(timeout)
    ))
    .await?;
    let key = LockKey::new("silent")?;
    let primary = cluster.primary_of(cluster.keyslot("silent:{silent}")?)?;
    let request = AcquireRequest::new(key, Owner::new("o")?, Duration::from_secs(30));
    cluster.pause(primary)?;
    let started = tokio::time::Instant::now();
    let outcome = backend.try_acquire(&request).await;
    let took = started.elapsed();
    cluster.resume(primary)?;
    match outcome {
        Err(e) if e.is_transient() => {}
        other => return Err(format!("expected a transient error, got {other:?} ({p})").into()),
    }
    let bound = timeout + fencelock_testkit::timeouts::SLACK;
    assert!(
        took <= bound,
        "failed only after {took:?}, more than {bound:?} ({p})"
    );
    Ok(())
}

/// A primary that stops answering (SIGSTOP) fails its own part of a
/// renewal batch only, within the caller's patience
/// ([`Renewal::within`]): the leases on the healthy primaries are renewed.
/// Before each part was bounded on its own, the stopped part held the whole
/// batch past the renewer's bound, and every holder of the client lost its
/// lease (the availability scorecard, docs/faults.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_primary_fails_only_its_own_part_of_a_batch() -> TestResult {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await??;
    let backend = RedisBackend::connect(&format!("{}?prefix=part", cluster.url())).await?;
    let p = Patience::against(&backend).await;
    let owner = Owner::new("part")?;
    let ttl = p.ttl(Duration::from_secs(9));
    // What the client's renewer waits for a batch at this TTL.
    let within = ttl / 3;
    let mut renewals = Vec::new();
    let mut primaries = Vec::new();
    for i in 0..30 {
        let key = LockKey::new(format!("part-{i}"))?;
        primaries.push(cluster.primary_of(cluster.keyslot(&format!("part:{{{key}}}"))?)?);
        let request = AcquireRequest::new(key.clone(), owner.clone(), ttl);
        let Acquire::Granted(g) = backend.try_acquire(&request).await? else {
            return Err(format!("{key} was not free").into());
        };
        renewals.push(Renewal::new(request.lease(g.token), ttl).answered_within(within));
    }
    let stopped = primaries[0];
    cluster.pause(stopped)?;
    let answers = tokio::time::timeout(within, backend.renew_many(&renewals)).await;
    cluster.resume(stopped)?;
    let answers =
        answers.map_err(|_| format!("the batch got no answer within {within:?} ({p})"))??;
    assert_eq!(answers.len(), renewals.len());
    for ((renewal, primary), answer) in renewals.iter().zip(&primaries).zip(&answers) {
        let key = &renewal.lease.key;
        match answer {
            Ok(g) if *primary != stopped => assert_eq!(g.token, renewal.lease.token, "{key}"),
            Err(e) if *primary == stopped && e.is_transient() => {}
            other => {
                return Err(
                    format!("{key} on {primary} (stopped: {stopped}) got {other:?} ({p})").into(),
                )
            }
        }
    }
    Ok(())
}

/// What `attempt` answers once it is not a transient error, tried again
/// while it is, for up to `patience`.
async fn through_failover<T, F>(
    patience: Duration,
    mut attempt: impl FnMut() -> F,
) -> TestResult<fencelock_core::Result<T>>
where
    F: std::future::Future<Output = fencelock_core::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match attempt().await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                // Each attempt is bounded by the URL's timeout; one that
                // fails at once (the cluster still electing) waits a little.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) if e.is_transient() => {
                return Err(format!("still failing after {patience:?}: {e}").into())
            }
            outcome => return Ok(outcome),
        }
    }
}

/// A primary that stops answering (SIGSTOP, so its connections stay open
/// and no node redirects anything) is replaced by its replica within the
/// cluster's node time-out and an election; the client follows it there
/// while the old primary stays stopped: a lease held on it is renewed on
/// the promoted replica, and a new caller is granted a key of its slots.
/// Before the client followed failovers, its requests for those slots kept
/// going to the stopped node until it resumed, and the holder lost its
/// lock (the availability scorecard, docs/faults.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_primary_is_followed_to_its_promoted_replica() -> TestResult {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await??;
    let p = crate::patience(&cluster.url()).await?;
    let timeout = ms(p.bound(Duration::from_secs(1)));
    let url = format!("{}?prefix=follow&timeout={timeout}", cluster.url());
    // The grant waits for the replica (`WAIT`): the lease must be on it
    // before the stop. The client under test does not: once the replica is
    // promoted, no node is left to acknowledge its writes.
    let acquirer =
        RedisBackend::connect(&format!("{url}&wait_replicas=1&wait_timeout={timeout}")).await?;
    let backend = RedisBackend::connect(&url).await?;
    let owner = Owner::new("follow")?;
    // The lease must outlive the failover and the renewal that follows it.
    let ttl = p.ttl(Duration::from_secs(30));
    let held = LockKey::new("held")?;
    let stopped = cluster.primary_of(cluster.keyslot("follow:{held}")?)?;
    let mut fresh = None;
    for i in 0..100 {
        let key = LockKey::new(format!("fresh-{i}"))?;
        if cluster.primary_of(cluster.keyslot(&format!("follow:{{{key}}}"))?)? == stopped {
            fresh = Some(key);
            break;
        }
    }
    let fresh = fresh.ok_or("no key of 100 is on the held key's primary")?;
    let request = AcquireRequest::new(held, owner.clone(), ttl);
    let Acquire::Granted(g) = acquirer.try_acquire(&request).await? else {
        return Err("the key was not free".into());
    };
    let lease = request.lease(g.token);
    backend.renew(&lease, ttl).await?;

    cluster.pause(stopped)?;
    let patience = p.bound(Duration::from_secs(20));
    let renewed = through_failover(patience, || backend.renew(&lease, ttl)).await;
    let new_caller = AcquireRequest::new(fresh, owner.clone(), ttl);
    let granted = through_failover(patience, || backend.try_acquire(&new_caller)).await;
    // Still stopped when both answered: what answered is the replica.
    let promoted = cluster.primary_of(cluster.keyslot("follow:{held}")?);
    cluster.resume(stopped)?;

    let renewed = renewed
        .map_err(|e| format!("{e} ({p})"))?
        .map_err(|e| format!("the renewal through the failover: {e} ({p})"))?;
    assert_eq!(renewed.token, lease.token, "renewed as the same grant");
    let granted = granted
        .map_err(|e| format!("{e} ({p})"))?
        .map_err(|e| format!("the new caller through the failover: {e} ({p})"))?;
    assert!(
        matches!(granted, Acquire::Granted(_)),
        "a free key of the stopped primary's slots was not granted ({p})"
    );
    assert_ne!(promoted?, stopped, "the replica took the slots over");
    Ok(())
}
