//! `fencelock run` on etcd stops its command when the lock key is deleted
//! behind its back (`etcdctl del`), as on every other backend: the lease
//! kept alive alone is not the lock.
//!
//! Time: a real process and server. The lease (base 3 s, whole seconds as
//! etcd grants them), the job it runs (30 s), the wait for the holder to
//! take the key (20 s), the other client's lease (30 s) and the bound on
//! how soon the holder stops (10 s: a few renewal periods, each a third
//! of the lease) are scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first, the bound by
//! the same factor as the renewal period it counts; a failure names the
//! budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use support::{code, fencelock_at as fencelock, ms, patience, whole_secs};

use fencelock_testkit::servers::etcd::EtcdCluster;

#[test]
fn run_exits_76_when_its_key_is_deleted_and_another_client_takes_it() {
    let etcd = EtcdCluster::start().unwrap();
    let url = format!("{}?prefix=loss", etcd.url());
    let p = patience();
    // Renewed every third of its lease; the job would run far longer.
    let ttl = ms(whole_secs(p.ttl(Duration::from_secs(3))));
    let job = p.bound(Duration::from_secs(30)).as_secs().to_string();
    let holder = fencelock(&url, &["run", "K", "--ttl", &ttl, "--", "sleep", &job])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + p.bound(Duration::from_secs(20));
    while code(&fencelock(&url, &["inspect", "K"]).output().unwrap()) != 0 {
        assert!(Instant::now() < deadline, "the holder never took K [{p}]");
        std::thread::sleep(Duration::from_millis(50));
    }

    assert_eq!(etcd.delete_key("loss/locks/K").unwrap(), 1);
    let deleted = Instant::now();
    let other_ttl = ms(p.ttl(Duration::from_secs(30)));
    let other = fencelock(
        &url,
        &["acquire", "K", "--ttl", &other_ttl, "--owner", "other"],
    )
    .output()
    .unwrap();
    assert_eq!(
        code(&other),
        0,
        "{} [{p}]",
        String::from_utf8_lossy(&other.stderr)
    );

    let out = holder.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 76, "{stderr} [{p}]");
    assert!(stderr.contains("lost lock K"), "{stderr}");
    // A few renewal periods, far below the time the job would have run.
    let bound = p.bound(Duration::from_secs(10));
    assert!(
        deleted.elapsed() < bound,
        "the holder stopped only {:?} after the deletion, past {bound:?} [{p}]",
        deleted.elapsed()
    );
}
