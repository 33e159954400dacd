//! `fencelock run` on etcd stops its command when the lock key is deleted
//! behind its back (`etcdctl del`), as on every other backend: the lease
//! kept alive alone is not the lock.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use support::{code, fencelock_at as fencelock};

use fencelock_testkit::servers::etcd::EtcdCluster;

#[test]
fn run_exits_76_when_its_key_is_deleted_and_another_client_takes_it() {
    let etcd = EtcdCluster::start().unwrap();
    let url = format!("{}?prefix=loss", etcd.url());
    // Renewed every second; the job would run 30 s.
    let holder = fencelock(&url, &["run", "K", "--ttl", "3s", "--", "sleep", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while code(&fencelock(&url, &["inspect", "K"]).output().unwrap()) != 0 {
        assert!(Instant::now() < deadline, "the holder never took K");
        std::thread::sleep(Duration::from_millis(50));
    }

    assert_eq!(etcd.delete_key("loss/locks/K").unwrap(), 1);
    let deleted = Instant::now();
    let other = fencelock(&url, &["acquire", "K", "--ttl", "30s", "--owner", "other"])
        .output()
        .unwrap();
    assert_eq!(
        code(&other),
        0,
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );

    let out = holder.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 76, "{stderr}");
    assert!(stderr.contains("lost lock K"), "{stderr}");
    // A few renewal periods, far below the 30 s the job would have run.
    assert!(
        deleted.elapsed() < Duration::from_secs(10),
        "the holder stopped only {:?} after the deletion",
        deleted.elapsed()
    );
}
