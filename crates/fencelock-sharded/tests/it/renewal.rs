//! A client's renewer sends every lease it holds in one `renew_many`
//! batch, bounded as a whole: a shard that stops answering (its site cut
//! off) must fail its own leases only. Found in the lab: a holder in one
//! site lost the lock of a key homed in its own site because it also held
//! one homed across the cut (docs/multi-dc.md).

use crate::common;

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use fencelock_core::{
    fault::{Fault, FaultyBackend},
    Backend, LockClient, MemoryBackend, Renewal,
};
use fencelock_sharded::{OpenFuture, Placement, Shard, ShardMap, ShardedBackend};
use fencelock_testkit::TestResult;

const TTL: Duration = Duration::from_secs(30);

/// The shard that stops answering.
fn hung() -> &'static Arc<FaultyBackend> {
    static HUNG: OnceLock<Arc<FaultyBackend>> = OnceLock::new();
    HUNG.get_or_init(|| FaultyBackend::new(Arc::new(MemoryBackend::new())))
}

/// `mem://hung` is [`hung`]; the rest as the other tests open them.
fn open(url: String) -> OpenFuture {
    if url == "mem://hung" {
        let backend: Arc<dyn Backend> = hung().clone();
        return Box::pin(async move { Ok(backend) });
    }
    common::open(url)
}

#[tokio::test(start_paused = true)]
async fn a_shard_that_stops_answering_fails_only_its_own_renewals() -> TestResult {
    let map = ShardMap::new(
        1,
        vec![
            Shard::new("here", "mem://renewal-here"),
            Shard::new("there", "mem://hung"),
        ],
    )?
    .with_placement(vec![
        Placement::prefix("here:", "here"),
        Placement::prefix("there:", "there"),
    ])?;
    let backend: Arc<dyn Backend> = Arc::new(ShardedBackend::open(map, open).await?);
    let client = LockClient::new(Arc::clone(&backend));
    let (here, there) = (
        client.lock("here:1").ttl(TTL).acquire().await?,
        client.lock("there:1").ttl(TTL).acquire().await?,
    );
    hung().set(Fault::Hang);
    // The batch answers each lease, in order, before the renewer's bound.
    let started = tokio::time::Instant::now();
    let answers = backend
        .renew_many(&[
            Renewal::new(there.lease().clone(), TTL),
            Renewal::new(here.lease().clone(), TTL),
        ])
        .await?;
    assert!(started.elapsed() < TTL / 3, "{:?}", started.elapsed());
    match &answers[0] {
        Err(e) => assert!(e.to_string().contains("no answer within"), "{e}"),
        Ok(grant) => return Err(format!("the stuck shard renewed: {grant:?}").into()),
    }
    assert_eq!(
        answers[1].as_ref().map_err(|e| e.to_string())?.token,
        here.token()
    );
    // The renewer, through several renewal periods: the lease on the shard
    // that answers lives, the other is lost.
    tokio::time::sleep(TTL * 3).await;
    assert!(here.is_valid(), "{:?}", here.check());
    assert!(!there.is_valid());
    here.release().await?;
    Ok(())
}
