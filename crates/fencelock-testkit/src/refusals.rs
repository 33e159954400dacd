//! Answers that need no retry are given at once, on every backend that
//! connects over the network (`docs/semantics.md`, "Answers that need no
//! retry"): refused credentials are `unauthorized` within a round trip or
//! two (not `internal`, not after retries), and a host the resolver does
//! not know fails as soon as the resolver says so (not after the connect
//! timeout).

use std::{
    future::Future,
    time::{Duration, Instant},
};

use crate::{cases::ensure, patience::Patience, TestResult};

/// How long a refusal of credentials may take: a connection and its
/// handshake on loopback, as the base of a measured budget ([`Patience`]):
/// retries would take seconds more.
pub const REFUSED_WITHIN: Duration = Duration::from_secs(1);
/// What the resolver's answer may be followed by before a failure, as the
/// base of a measured budget.
const AFTER_RESOLVER: Duration = Duration::from_millis(500);

/// A host name no resolver knows (RFC 2606).
pub const UNKNOWN_HOST: &str = "no-such-host.invalid";

/// Each of `urls` (what, URL) names credentials the server refuses:
/// opening it fails within [`REFUSED_WITHIN`] (scaled) with code `unauthorized`, a
/// permanent error whose text shows none of `secrets`.
pub async fn refused_credentials_are_unauthorized_at_once<T, Fut>(
    urls: &[(&str, String)],
    secrets: &[&str],
    open: impl Fn(String) -> Fut,
) -> TestResult
where
    Fut: Future<Output = fencelock_core::Result<T>>,
{
    let within = Patience::measure().await.bound(REFUSED_WITHIN);
    for (what, url) in urls {
        let started = Instant::now();
        let Err(e) = open(url.clone()).await else {
            return Err(format!("{what}: opened with credentials the server refuses").into());
        };
        let took = started.elapsed();
        ensure!(
            e.code() == "unauthorized" && !e.is_transient(),
            "{what}: {e} (code {}), not unauthorized",
            e.code()
        );
        ensure!(
            took < within,
            "{what}: refused after {took:?}, more than {within:?}"
        );
        let shown = e.to_string();
        ensure!(
            !secrets.iter().any(|s| shown.contains(s)),
            "{what}: the error shows a password: {shown}"
        );
    }
    Ok(())
}

/// Opening `url_for(UNKNOWN_HOST)` fails with a transient error
/// (`unavailable`) within the resolver's own time plus half a second
/// (scaled by a measured budget).
pub async fn an_unknown_host_fails_when_the_resolver_answers<T, Fut>(
    url_for: impl FnOnce(&str) -> String,
    open: impl FnOnce(String) -> Fut,
) -> TestResult
where
    Fut: Future<Output = fencelock_core::Result<T>>,
{
    let after = Patience::measure().await.bound(AFTER_RESOLVER);
    let started = Instant::now();
    let resolved = tokio::net::lookup_host((UNKNOWN_HOST, 1)).await;
    let resolver = started.elapsed();
    ensure!(resolved.is_err(), "{UNKNOWN_HOST} resolved");
    let started = Instant::now();
    let Err(e) = open(url_for(UNKNOWN_HOST)).await else {
        return Err(format!("{UNKNOWN_HOST}: opened").into());
    };
    let took = started.elapsed();
    ensure!(
        e.code() == "unavailable",
        "{UNKNOWN_HOST}: {e} (code {})",
        e.code()
    );
    ensure!(
        took < resolver + after,
        "failed after {took:?}; the resolver answered in {resolver:?}"
    );
    Ok(())
}
