//! Answers that need no retry are given at once: a wrong or missing
//! password is `unauthorized` within one round trip (not `internal` after
//! the connection manager's retries), and a host the resolver does not
//! know is `unavailable` as soon as the resolver says so (not after the
//! connect timeout).

use std::time::{Duration, Instant};

use fencelock_core::Driver;
use fencelock_testkit::{servers::redis::RedisServer, TestResult};

async fn open(url: &str) -> (fencelock_core::Result<()>, Duration) {
    let started = Instant::now();
    let opened = fencelock_redis::RedisDriver
        .open_backend(url)
        .await
        .map(drop);
    (opened, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_unauthorized_at_once() -> TestResult {
    let redis = RedisServer::start()?;
    let port = redis.port();
    let mut admin = redis::Client::open(redis.url())?.get_connection()?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("right-password")
        .exec(&mut admin)?;

    let good = format!("redis://:right-password@127.0.0.1:{port}");
    let (opened, _) = open(&good).await;
    opened?;

    for (what, url) in [
        ("wrong", format!("redis://:wrong-password@127.0.0.1:{port}")),
        ("missing", format!("redis://127.0.0.1:{port}")),
        (
            "unknown user",
            format!("redis://nobody:right-password@127.0.0.1:{port}"),
        ),
    ] {
        let (opened, took) = open(&url).await;
        let e = opened.expect_err(what);
        assert_eq!(e.code(), "unauthorized", "{what} password: {e}");
        assert!(!e.is_transient(), "{what} password: {e}");
        assert!(
            took < Duration::from_secs(1),
            "{what} password: refused after {took:?}"
        );
        let shown = e.to_string();
        assert!(
            !shown.contains("right-password") && !shown.contains("wrong-password"),
            "{shown}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_fails_when_the_resolver_answers() -> TestResult {
    let host = "no-such-host.invalid";
    let started = Instant::now();
    let resolved = tokio::net::lookup_host((host, 6379)).await;
    let resolver = started.elapsed();
    assert!(resolved.is_err(), "{host} resolved");

    let (opened, took) = open(&format!("redis://{host}:6379")).await;
    let e = opened.expect_err("an unknown host");
    assert_eq!(e.code(), "unavailable", "{e}");
    assert!(
        took < resolver + Duration::from_millis(500),
        "failed after {took:?}; the resolver answered in {resolver:?}"
    );
    Ok(())
}
