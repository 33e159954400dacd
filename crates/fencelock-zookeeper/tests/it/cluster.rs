//! A 3-member ZooKeeper ensemble on loopback: several clients acquire and
//! release one key in a loop while the leader is killed (the test kit's
//! `failover` run: no overlapping grants, tokens strictly growing,
//! acquisition resuming). Also checks that tokens (creation zxids) cross
//! into the new leader's epoch: the zxid's high half is the epoch.
//!
//! Time: a real ensemble killed for real, so no paused clock. The URL's
//! `timeout` (a base of 2 s) is scaled by a patience measured against the
//! ensemble first; the `failover` run's own figures are the test kit's.

use std::{sync::Arc, time::Duration};

use fencelock_core::Backend;
use fencelock_testkit::{
    failover::{leader_failover, Ensemble, Hook},
    servers::zookeeper::ZkServer,
    TestResult,
};
use fencelock_zookeeper::ZkBackend;

struct Zk {
    ensemble: Arc<ZkServer>,
    url: String,
}

impl Ensemble for Zk {
    fn open(&self) -> Hook<'_, Arc<dyn Backend>> {
        Box::pin(
            async move { Ok(Arc::new(ZkBackend::connect(&self.url).await?) as Arc<dyn Backend>) },
        )
    }

    fn leader(&self, dead: Option<usize>) -> Hook<'_, usize> {
        let ensemble = Arc::clone(&self.ensemble);
        Box::pin(async move {
            let leader = tokio::task::spawn_blocking(move || ensemble.leader()).await?;
            leader
                .filter(|l| Some(*l) != dead)
                .ok_or_else(|| "no live member says it leads".into())
        })
    }

    fn kill(&self, member: usize) -> TestResult {
        self.ensemble.kill(member)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_exclusion_and_token_order() -> TestResult {
    let ensemble = Arc::new(tokio::task::spawn_blocking(|| ZkServer::start_members(3)).await??);
    let p = crate::patience(&ensemble.url()).await?;
    let url = format!(
        "{}?prefix=cluster&timeout={}ms",
        ensemble.url(),
        p.bound(Duration::from_secs(2)).as_millis()
    );
    let run = leader_failover(Arc::new(Zk { ensemble, url }), "cluster-hot")
        .await
        .map_err(|e| format!("{e} ({p})"))?;
    let epoch = |t: u64| t >> 32;
    let (first, last) = (run.tokens[0], run.tokens[run.tokens.len() - 1]);
    assert!(
        epoch(last) > epoch(first),
        "no grant carries the new leader's epoch ({p})"
    );
    eprintln!("{run}");
    Ok(())
}
