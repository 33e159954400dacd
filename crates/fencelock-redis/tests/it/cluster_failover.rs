//! A Redis Cluster (three primaries, three replicas) on loopback, its
//! primaries killed with SIGKILL:
//!
//! - the test kit's `failover` run: clients acquire and release one key in
//!   a loop while the primary of its slot is killed; no overlapping grants,
//!   tokens strictly growing, acquisition resuming on the promoted replica;
//! - many keys spread over every primary, some held, one primary killed:
//!   after the promotion every key is granted again with a token above all
//!   its earlier ones (the `TIME` floor, whatever the replica had received),
//!   and `list` (a SCAN per primary) still finds the held keys.
//!
//! Time: a real cluster killed for real, so no paused clock. A
//! [`Patience`] measured against the cluster first scales the URL's
//! `timeout` (a base of 2 s), the wait for each grant after the failover (a
//! base of 30 s) and the leases that must outlive the failover and every
//! key's regrant, so that `list` still finds them (a base of 60 s). The
//! `failover` run's own figures are the test kit's.

use std::{collections::HashMap, sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, FencingToken, LeaseId, LockKey, Owner,
};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{
    failover::{leader_failover, Ensemble, Hook},
    servers::redis_cluster::RedisCluster,
    Patience, TestResult,
};

struct Cluster {
    cluster: Arc<RedisCluster>,
    url: String,
    /// The slot of the key the failover run takes.
    slot: u16,
}

impl Ensemble for Cluster {
    fn open(&self) -> Hook<'_, Arc<dyn Backend>> {
        Box::pin(async move {
            Ok(Arc::new(RedisBackend::connect(&self.url).await?) as Arc<dyn Backend>)
        })
    }

    /// Members are named by port; the "leader" is the primary of the key's
    /// slot.
    fn leader(&self, _dead: Option<usize>) -> Hook<'_, usize> {
        let cluster = Arc::clone(&self.cluster);
        let slot = self.slot;
        Box::pin(async move {
            let port = tokio::task::spawn_blocking(move || cluster.primary_of(slot)).await??;
            Ok(usize::from(port))
        })
    }

    fn kill(&self, member: usize) -> TestResult {
        self.cluster.kill(u16::try_from(member)?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_failover_keeps_exclusion_and_token_order() -> TestResult {
    let cluster = Arc::new(tokio::task::spawn_blocking(RedisCluster::start).await??);
    let p = crate::patience(&cluster.url()).await?;
    let url = format!(
        "{}?prefix=failover&timeout={}",
        cluster.url(),
        crate::ms(p.bound(Duration::from_secs(2)))
    );
    let slot = cluster.keyslot("failover:{cluster-hot}")?;
    let ensemble = Arc::new(Cluster { cluster, url, slot });
    let run = leader_failover(ensemble as Arc<dyn Ensemble>, "cluster-hot")
        .await
        .map_err(|e| format!("{e} ({p})"))?;
    eprintln!("{run}");
    Ok(())
}

fn request(key: &LockKey, owner: &Owner, p: Patience) -> AcquireRequest {
    AcquireRequest::new(key.clone(), owner.clone(), p.ttl(Duration::from_secs(60)))
}

/// A grant of `key`, retried through the failover; `None` if still held.
async fn grant_after_failover(
    b: &RedisBackend,
    key: &LockKey,
    owner: &Owner,
    p: Patience,
) -> TestResult<Option<FencingToken>> {
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(30));
    loop {
        let last = match b.try_acquire(&request(key, owner, p)).await {
            Ok(Acquire::Granted(g)) => return Ok(Some(g.token)),
            Ok(Acquire::Held(_)) => return Ok(None),
            Err(e) if e.is_transient() => e.to_string(),
            Err(e) => return Err(e.into()),
        };
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no answer for {key} after the failover: {last} ({p})").into());
        }
        // Bounded retry while the client refreshes its slot map.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_per_key_on_the_promoted_replica() -> TestResult {
    let cluster = Arc::new(tokio::task::spawn_blocking(RedisCluster::start).await??);
    let backend = RedisBackend::connect(&format!("{}?prefix=promote", cluster.url())).await?;
    let p = Patience::against(&backend).await;
    let owner = Owner::new("before")?;
    let keys: Vec<LockKey> = (0..30)
        .map(|i| LockKey::new(format!("promote-{i}")))
        .collect::<Result<_, _>>()?;
    let mut slots = HashMap::new();
    for key in &keys {
        slots.insert(key.clone(), cluster.keyslot(&format!("promote:{{{key}}}"))?);
    }
    let mut primaries = Vec::new();
    for slot in slots.values() {
        primaries.push(cluster.primary_of(*slot)?);
    }
    primaries.sort_unstable();
    primaries.dedup();
    assert_eq!(primaries.len(), 3, "30 keys should span every primary");

    // Several grants per key; every third key stays held.
    let mut highest: HashMap<LockKey, FencingToken> = HashMap::new();
    let mut held = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        for round in 0..5 {
            let Acquire::Granted(g) = backend.try_acquire(&request(key, &owner, p)).await? else {
                return Err(format!("{key} was not free").into());
            };
            highest.insert(key.clone(), g.token);
            if i % 3 == 0 && round == 4 {
                held.push(key.clone());
            } else {
                backend
                    .release(&LeaseId::new(key.clone(), owner.clone(), g.token))
                    .await?;
            }
        }
    }
    let listed = backend.list(None).await?;
    assert_eq!(
        listed.len(),
        held.len(),
        "list before the failover: {listed:?}"
    );

    let victim_slot = slots[&keys[0]];
    let (old, new) = {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || cluster.fail_over(victim_slot)).await??
    };
    eprintln!("primary {old} killed, replica {new} promoted");

    let after = Owner::new("after")?;
    let mut regranted = 0;
    for key in &keys {
        match grant_after_failover(&backend, key, &after, p).await? {
            Some(token) => {
                regranted += 1;
                assert!(
                    token > highest[key],
                    "{key}: token {token} after the failover is not above {}",
                    highest[key]
                );
            }
            // A held key whose lease the replica had received.
            None => assert!(held.contains(key), "{key} was free but is held"),
        }
    }
    assert!(
        regranted >= keys.len() - held.len(),
        "{regranted} regranted"
    );
    // `list` scans every primary, the promoted one included.
    let listed = backend.list(None).await?;
    assert_eq!(listed.len(), keys.len(), "list after the failover ({p})");
    Ok(())
}
