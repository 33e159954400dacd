//! Answers that need no retry are given at once (the shared check in
//! `fencelock_testkit::refusals`): a wrong or missing password is
//! `unauthorized` within one round trip (not `internal` after the
//! connection manager's retries), and a host the resolver does not know is
//! `unavailable` as soon as the resolver says so.
//!
//! Time: the bounds ("at once", "when the resolver answers") are the shared
//! check's (`fencelock_testkit::refusals`); this file sets no figure.

use fencelock_core::Driver;
use fencelock_testkit::{refusals, servers::redis::RedisServer, TestResult};

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
    let open = |url: String| async move { fencelock_redis::RedisDriver.open_backend(&url).await };
    open(format!("redis://:right-password@127.0.0.1:{port}")).await?;
    refusals::refused_credentials_are_unauthorized_at_once(
        &[
            (
                "wrong password",
                format!("redis://:wrong-password@127.0.0.1:{port}"),
            ),
            ("missing password", format!("redis://127.0.0.1:{port}")),
            (
                "unknown user",
                format!("redis://nobody:right-password@127.0.0.1:{port}"),
            ),
        ],
        &["right-password", "wrong-password"],
        open,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_fails_when_the_resolver_answers() -> TestResult {
    refusals::an_unknown_host_fails_when_the_resolver_answers(
        |host| format!("redis://{host}:6379"),
        |url| async move { fencelock_redis::RedisDriver.open_backend(&url).await },
    )
    .await
}
