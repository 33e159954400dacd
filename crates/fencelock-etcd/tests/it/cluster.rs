//! A 3-member etcd cluster on loopback: several clients acquire and release
//! one key in a loop while the leader is killed (the test kit's `failover`
//! run: no overlapping grants, tokens strictly growing, acquisition
//! resuming). Also checks the server's own history of the key: no two
//! grants overlapped there either, and every token is a create.
//!
//! Time: a real cluster. The failover run measures its own budget and
//! scales its workers' leases and bounds (`fencelock_testkit::failover`);
//! the clients' request `timeout` (base 2 s) is scaled here from a
//! [`Patience`] measured first. The server's history is no matter of time.

use std::{sync::Arc, time::Duration};

use etcd_client::{Client, EventType, WatchOptions};
use fencelock_core::Backend;
use fencelock_etcd::EtcdBackend;
use fencelock_testkit::{
    failover::{leader_failover, Ensemble, Failover, Hook},
    servers::etcd::EtcdCluster,
    Patience, TestResult,
};

struct Etcd {
    cluster: Arc<EtcdCluster>,
    url: String,
}

impl Ensemble for Etcd {
    fn open(&self) -> Hook<'_, Arc<dyn Backend>> {
        Box::pin(
            async move { Ok(Arc::new(EtcdBackend::connect(&self.url).await?) as Arc<dyn Backend>) },
        )
    }

    fn leader(&self, dead: Option<usize>) -> Hook<'_, usize> {
        Box::pin(async move {
            match dead {
                None => leader(&self.cluster).await,
                Some(dead) => leader_among_survivors(&self.cluster, dead).await,
            }
        })
    }

    fn kill(&self, member: usize) -> TestResult {
        self.cluster.kill(member)
    }
}

/// The index of the member that is the current leader.
async fn leader(cluster: &EtcdCluster) -> TestResult<usize> {
    for i in 0..cluster.len() {
        let mut c = Client::connect([cluster.endpoint(i)], None).await?;
        let status = c.status().await?;
        let me = status.header().map(|h| h.member_id()).ok_or("no header")?;
        if status.leader() == me {
            return Ok(i);
        }
    }
    Err("no member says it is the leader".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_exclusion_and_token_order() -> TestResult {
    let cluster = Arc::new(tokio::task::spawn_blocking(|| EtcdCluster::start_members(3)).await??);
    let p = Patience::measure().await;
    eprintln!("time budget: {p}");
    let url = format!(
        "{}?prefix=cluster&timeout={}ms",
        cluster.url(),
        p.bound(Duration::from_secs(2)).as_millis()
    );
    let etcd = Arc::new(Etcd { cluster, url });
    let run = leader_failover(Arc::clone(&etcd) as Arc<dyn Ensemble>, "cluster-hot").await?;
    etcd.server_history_agrees(&run).await?;
    eprintln!("{run}");
    Ok(())
}

impl Etcd {
    async fn server_history_agrees(&self, run: &Failover) -> TestResult {
        // The server's own history of the key: every grant is a create (PUT at
        // version 1) and each is deleted before the next create, so no two
        // grants ever overlapped on the server.
        let mut client =
            Client::connect([self.cluster.endpoint((run.victim + 1) % 3)], None).await?;
        let full_key = format!("cluster/locks/{}", run.key.as_str());
        let marker = client.put(full_key.clone(), "end", None).await?;
        let end = marker.header().map(|h| h.revision()).ok_or("no header")?;
        let mut watch = client
            .watch(full_key, Some(WatchOptions::new().with_start_revision(1)))
            .await?;
        let mut held: Option<i64> = None;
        let mut creates = Vec::new();
        'history: while let Some(resp) = watch.message().await? {
            for event in resp.events() {
                let kv = event.kv().ok_or("event without kv")?;
                if kv.mod_revision() >= end {
                    break 'history;
                }
                match event.event_type() {
                    EventType::Put => {
                        assert!(
                            held.is_none(),
                            "create at {} while {held:?} held",
                            kv.mod_revision()
                        );
                        assert_eq!(
                            kv.create_revision(),
                            kv.mod_revision(),
                            "a grant modified a live key"
                        );
                        held = Some(kv.create_revision());
                        creates.push(u64::try_from(kv.create_revision())?);
                    }
                    EventType::Delete => held = None,
                }
            }
        }
        for t in &run.tokens {
            assert!(
                creates.binary_search(t).is_ok(),
                "token {t} is not a create in the history"
            );
        }
        Ok(())
    }
}

async fn leader_among_survivors(cluster: &EtcdCluster, dead: usize) -> TestResult<usize> {
    for i in (0..cluster.len()).filter(|&i| i != dead) {
        let mut c = Client::connect([cluster.endpoint(i)], None).await?;
        let status = c.status().await?;
        let leader_id = status.leader();
        for j in (0..cluster.len()).filter(|&j| j != dead) {
            let mut cj = Client::connect([cluster.endpoint(j)], None).await?;
            let s = cj.status().await?;
            if s.header().map(|h| h.member_id()) == Some(leader_id) {
                return Ok(j);
            }
        }
    }
    Err("the survivors have no leader".into())
}
