//! What `fencelock run` prints when it loses its lock to a backend outage:
//! the loss is the last line on stderr (no "renewal failed; retrying while
//! the lease is still trusted" after it, from a renewal still in flight),
//! and no backend error repeats its "redis backend:" prefix.
//!
//! Time: a real process and server. The holder must keep its lease until
//! the outage (so that the loss is the outage's), its job must outlast the
//! loss, and the test waits for it to take the key: the lease (base 1 s),
//! the job (30 s) and the wait (20 s) are scaled from a
//! [`Patience`](fencelock_testkit::Patience) measured first; a failure
//! names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use support::{fencelock_at as fencelock, ms, patience};

use fencelock_testkit::{proxy::ProxiedUrl, servers::redis::RedisServer};

#[test]
fn a_lost_lock_is_reported_last_and_redis_errors_name_their_backend_once() {
    let server = RedisServer::start().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxied = runtime.block_on(ProxiedUrl::start(&server.url())).unwrap();
    let url = proxied.url().to_owned();
    let p = patience();
    // Renewed every third of its lease; the job would run far longer.
    let ttl = ms(p.ttl(Duration::from_secs(1)));
    let job = p.bound(Duration::from_secs(30)).as_secs().to_string();
    let holder = fencelock(&url, &["run", "K", "--ttl", &ttl, "--", "sleep", &job])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + p.bound(Duration::from_secs(20));
    while fencelock(&url, &["inspect", "K"])
        .output()
        .unwrap()
        .status
        .code()
        != Some(0)
    {
        assert!(Instant::now() < deadline, "the holder never took K [{p}]");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The outage: live connections reset (renewals fail with an I/O error,
    // the doubled prefix's path) and new ones refused, until the lease's
    // local deadline passes with renewals still in flight.
    proxied.set_refuse(true);
    proxied.reset_all();
    let out = holder.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr} [{p}]");
    assert!(!stderr.contains("redis backend: redis backend"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("fencelock: lost lock K"),
        "not last: {stderr}"
    );
    assert!(
        stderr.contains("renewal failed"),
        "the outage was not seen before the loss: {stderr} [{p}]"
    );
}
