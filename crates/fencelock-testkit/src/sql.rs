//! Checks shared by the relational engines (SQLite, PostgreSQL,
//! MySQL/MariaDB) beyond the conformance suite: each engine's own test file
//! supplies what only it can do (raise its counter behind the library's
//! back, read it, name its URLs), and the check itself is written once.

use std::{future::Future, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, FencingToken, LeaseId, LockKey, LockMode, Owner,
};

use crate::{cases::ensure, TestResult};

/// The counter of a backend that draws every key's tokens from one counter
/// ends at [`FencingToken::MAX`] with a typed error on the key asked for,
/// by each path that draws (a writer, a reader, several keys at once), and
/// stays at the last token; held leases keep renewing and releasing.
///
/// `set_counter(t)` stores `t` as the last token drawn, behind the
/// library's back; `read_counter()` reads it back.
pub async fn the_counters_end_is_a_typed_error<SetFut, ReadFut>(
    backend: &dyn Backend,
    set_counter: impl FnOnce(u64) -> SetFut,
    read_counter: impl FnOnce() -> ReadFut,
) -> TestResult
where
    SetFut: Future<Output = TestResult>,
    ReadFut: Future<Output = TestResult<u64>>,
{
    let held = granted(backend, "held", "a").await?;
    set_counter(FencingToken::MAX.get() - 1).await?;
    let last = granted(backend, "last", "a").await?;
    ensure!(
        last.token == FencingToken::MAX,
        "the last grant drew {}",
        last.token
    );
    backend.release(&last).await?;
    // "last" is free again: the end is the counter's, not a key's.
    for key in ["next", "last"] {
        let asked = request(key, "b")?;
        for spent in [
            backend.try_acquire(&asked).await.map(drop),
            backend
                .try_acquire(&asked.clone().with_mode(LockMode::Shared))
                .await
                .map(drop),
            backend
                .try_acquire_all(std::slice::from_ref(&asked))
                .await
                .map(drop),
        ] {
            ensure!(
                matches!(&spent, Err(Error::TokensExhausted { key: k }) if k.as_str() == key),
                "{key} past the counter's end: {spent:?}"
            );
        }
    }
    backend.renew(&held, TTL).await?;
    backend.release(&held).await?;
    let counter = read_counter().await?;
    ensure!(
        counter == FencingToken::MAX.get(),
        "the counter moved past its end to {counter}"
    );
    Ok(())
}

/// Two openers initialising the same fresh table prefix at once (a
/// backend and a fence, typically) both succeed, five times over:
/// `open(url)` for `url` = `base?table_prefix=schema<round>_`.
pub async fn concurrent_schema_creation<A, B, FutA, FutB>(
    base: &str,
    open_backend: impl Fn(String) -> FutA,
    open_fence: impl Fn(String) -> FutB,
) -> TestResult
where
    FutA: Future<Output = fencelock_core::Result<A>>,
    FutB: Future<Output = fencelock_core::Result<B>>,
{
    for round in 0..5 {
        let url = format!("{base}?table_prefix=schema{round}_");
        let (a, b) = tokio::join!(open_backend(url.clone()), open_fence(url));
        a?;
        b?;
    }
    Ok(())
}

/// Each of `urls`, malformed, is refused by `open` with `invalid_url`,
/// and neither the error's text nor its debug form shows `secret`.
pub async fn malformed_urls_hide_the_password<T, Fut>(
    urls: &[&str],
    secret: &str,
    open: impl Fn(String) -> Fut,
) -> TestResult
where
    Fut: Future<Output = fencelock_core::Result<T>>,
{
    for url in urls {
        let Err(e) = open(url.to_string()).await else {
            return Err(format!("{url}: opened").into());
        };
        ensure!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
        ensure!(!e.to_string().contains(secret), "{url}: {e}");
        ensure!(!format!("{e:?}").contains(secret), "{url}: {e:?}");
    }
    Ok(())
}

/// Long enough that nothing expires during a check.
const TTL: Duration = Duration::from_secs(60);

fn request(key: &str, owner: &str) -> TestResult<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockKey::new(key)?,
        Owner::new(owner)?,
        TTL,
    ))
}

async fn granted(backend: &dyn Backend, key: &str, owner: &str) -> TestResult<LeaseId> {
    let asked = request(key, owner)?;
    match backend.try_acquire(&asked).await? {
        Acquire::Granted(g) => Ok(asked.lease(g.token)),
        held => Err(format!("{key} not granted: {held:?}").into()),
    }
}
