//! A release is a touch (shortening the lease to a millisecond) and a
//! delete (`docs/zookeeper.md`), now in one transaction; versions that sent
//! them apart left the touched lease readable in between. A reader that
//! read the leader's clock before the touch and the lease after it must
//! not report a lease that ends within milliseconds: an election observer
//! that saw one and then found it gone would report the leader's
//! resignation as an expiry. Readers count a touched lease as released.
//!
//! Time: a real server, so no paused clock. A lease counts as "ending"
//! when it reads under half its TTL; the TTL (a base of 30 s) is scaled by
//! a patience measured against the server first, so that a live lease read
//! late on a busy machine still reads far from its end while a touched one
//! (a millisecond) never does.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{Backend, LockClient, LockKey};
use fencelock_testkit::{servers::zookeeper::ZkServer, TestResult};
use fencelock_zookeeper::ZkBackend;

/// The leases' TTL, as a base figure.
const TTL: Duration = Duration::from_secs(30);

/// Acquire-release cycles while inspectors read the key. The window
/// between a release's touch and its delete is short, so it takes many
/// reads to land in it; a few hundred cycles hit it reliably without the
/// fix.
const CYCLES: usize = 400;
const INSPECTORS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_being_released_is_never_reported_as_ending() -> TestResult {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await??;
    let p = crate::patience(&zk.url()).await?;
    let ttl = p.ttl(TTL);
    let holder = LockClient::new(Arc::new(ZkBackend::connect(&zk.url()).await?));
    let key = LockKey::new("leaving")?;
    let done = Arc::new(AtomicBool::new(false));
    let mut inspectors = Vec::with_capacity(INSPECTORS);
    for _ in 0..INSPECTORS {
        let reader = ZkBackend::connect(&zk.url()).await?;
        let (key, done) = (key.clone(), Arc::clone(&done));
        inspectors.push(tokio::spawn(async move {
            let mut reads = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let Some(info) = reader.inspect(&key).await.map_err(|e| e.to_string())? {
                    // A lease of this TTL is released long before it can
                    // come anywhere near its end.
                    if info.expires_in < ttl / 2 {
                        return Err(format!(
                            "inspect reported token {} of a {ttl:?} lease ending in {:?} ({p})",
                            info.token, info.expires_in
                        ));
                    }
                }
                reads += 1;
            }
            Ok::<_, String>(reads)
        }));
    }
    for _ in 0..CYCLES {
        holder
            .lock("leaving")
            .ttl(ttl)
            .acquire()
            .await?
            .release()
            .await?;
    }
    done.store(true, Ordering::Relaxed);
    for inspector in inspectors {
        let reads = inspector.await??;
        assert!(reads > 0, "an inspector never read the key");
    }
    Ok(())
}
