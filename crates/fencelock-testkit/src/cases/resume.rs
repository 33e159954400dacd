//! Sequencer checks and re-attachment (`docs/reentry.md`):
//! `LockClient::validate` answers true for exactly the current lease's
//! token, and `LockClient::resume` re-attaches to exactly one lease.

use std::sync::Arc;

use fencelock_core::{Backend, Error, FencingToken, LockClient};

use super::{client, ensure, guard_ttl, long_ttl, owner};
use crate::suite::{Store, TestResult};

/// `validate` is true for the current token only: not an older or newer
/// one, not another key's, not after release.
pub async fn validate_is_true_only_for_the_current_token(store: &dyn Store) -> TestResult {
    let c = client(store, "sequencer").await?;
    let checker = client(store, "resource").await?;
    let first = c.lock("seq").ttl(long_ttl()).acquire().await?;
    let old = first.token();
    first.release().await?;
    let guard = c.lock("seq").ttl(long_ttl()).acquire().await?;
    let t = guard.token();
    ensure!(
        checker.validate("seq", t).await?,
        "the current token {t} is refused"
    );
    for other in [old, FencingToken(t.get() + 1)] {
        ensure!(
            !checker.validate("seq", other).await?,
            "token {other} passes while {t} holds"
        );
    }
    ensure!(
        !checker.validate("seq-other", t).await?,
        "a token passes for a key it was not granted on"
    );
    guard.release().await?;
    ensure!(
        !checker.validate("seq", t).await?,
        "token {t} passes after its release"
    );
    Ok(())
}

/// A detached lease is re-attached by (key, owner, token) from another
/// client, which then renews it past its TTL; a wrong token or owner, or a
/// released lease, is `NotHeld`. Where leases are bound to the session of
/// the backend that took them, only a client on that backend can resume
/// one: through another, even the exact lease is `NotHeld`.
pub async fn resume_reattaches_to_the_exact_lease(store: &dyn Store) -> TestResult {
    let backend = store.connect().await?;
    let session_bound = backend.capabilities().session_bound;
    let on = |b: Arc<dyn Backend>, name: &str| LockClient::builder(b).owner(owner(name)).build();
    let first = on(Arc::clone(&backend), "worker")?;
    let other = client(store, "restarted").await?;
    let second = match session_bound {
        true => on(backend, "restarted")?,
        false => other.clone(),
    };
    let guard = first.lock("resumed").ttl(guard_ttl()).acquire().await?;
    let (o, t) = (guard.owner().clone(), guard.token());
    guard.detach();
    let mut wrong = vec![
        (owner("stranger"), t),
        (o.clone(), FencingToken(t.get() + 1)),
        (o.clone(), FencingToken(t.get() - 1)),
    ];
    if session_bound {
        wrong.push((o.clone(), t));
    }
    for (who, token) in wrong {
        let refused = other
            .resume("resumed", who.clone(), token)
            .ttl(guard_ttl())
            .await;
        ensure!(
            matches!(refused, Err(Error::NotHeld { .. })),
            "resume as {who} with token {token} gave {refused:?}"
        );
    }
    let resumed = second
        .resume("resumed", o.clone(), t)
        .ttl(guard_ttl())
        .await?;
    ensure!(
        resumed.token() == t,
        "resumed with token {}",
        resumed.token()
    );
    // Renewed by the second client's renewer well past the TTL.
    tokio::time::sleep(resumed.granted_ttl() * 3).await;
    resumed.check()?;
    let info = second.inspect("resumed").await?;
    ensure!(
        info.as_ref().is_some_and(|i| i.token == t && i.owner == o),
        "after three TTLs the lease is {info:?}"
    );
    resumed.release().await?;
    let gone = second.resume("resumed", o, t).ttl(guard_ttl()).await;
    ensure!(
        matches!(gone, Err(Error::NotHeld { .. })),
        "resume after release gave {gone:?}"
    );
    Ok(())
}
