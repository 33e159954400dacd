//! Leader election (`crates/fencelock-core/src/election.rs`) on every
//! backend: one leader at a time, growing terms, takeover after a
//! resignation and after a leader's lease ran out, observers told of both,
//! and a deposed leader's term refused by the fence. A crashed or cut-off
//! leader is simulated by a connection whose calls all fail from some
//! instant on ([`FaultyBackend`]): it stops renewing, and its lease ends on
//! the backend by expiry alone.

use std::time::Duration;

use fencelock_core::{
    fault::{Fault, FaultyBackend},
    Error, FencingToken, LeaderChange, LeaderWatch, LockClient,
};

use super::{client, ensure, guard_ttl, long_ttl, owner};
use crate::suite::{Store, TestResult};

/// Far more than any backend needs to report a change (polling watches
/// included), far less than "never".
fn signal_bound() -> Duration {
    super::patient(Duration::from_secs(15))
}

/// Candidates racing for a vacant election: exactly one is elected each
/// round, and each round's term is above the last.
pub async fn one_leader_among_racing_candidates(store: &dyn Store) -> TestResult {
    const CANDIDATES: usize = 6;
    let mut clients = Vec::with_capacity(CANDIDATES);
    for i in 0..CANDIDATES {
        clients.push(client(store, &format!("candidate-{i}")).await?);
    }
    let mut last: Option<FencingToken> = None;
    for round in 0..3 {
        let attempts = clients.iter().map(|c| {
            let election = c.election("race").ttl(long_ttl());
            async move { election.campaign_for(Duration::ZERO).await }
        });
        let results = futures_util::future::join_all(attempts).await;
        let mut leaders = Vec::new();
        for result in results {
            match result {
                Ok(leadership) => leaders.push(leadership),
                Err(Error::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        ensure!(
            leaders.len() == 1,
            "round {round}: {} leaders elected",
            leaders.len()
        );
        let leadership = leaders.pop().ok_or("no leader")?;
        let term = leadership.term();
        ensure!(
            last.is_none_or(|l| term > l),
            "round {round}: term {term} after term {last:?}"
        );
        let seen = clients[0].election("race").leader().await?;
        ensure!(
            seen.as_ref().is_some_and(|l| l.term == term),
            "leader() reports {seen:?}, the winner's term is {term}"
        );
        last = Some(term);
        leadership.resign().await?;
    }
    Ok(())
}

/// A standby waiting in `campaign` is elected once the leader resigns, with
/// a higher term; an observer sees the election, the vacancy (not an
/// expiry) and the next election.
///
/// A polled observer tells a resignation from an expiry only if one of its
/// polls saw the lease within its remaining time before it went (see
/// `docs/election.md`): with a 2 s TTL a loaded machine that stalls polls for
/// 1.3 s turns the resignation into an expiry. The leader's TTL here is long
/// enough that only a stall of seconds would, which is not what this case
/// is about (expiries are `standby_takes_over_after_leader_expiry`).
pub async fn standby_takes_over_after_resignation(store: &dyn Store) -> TestResult {
    let leader_ttl = super::patient(Duration::from_secs(6));
    let (a, b, o) = (
        client(store, "leader").await?,
        client(store, "standby").await?,
        client(store, "observer").await?,
    );
    let mut changes = o.election("handover").observe().await?;
    let first = a
        .election("handover")
        .ttl(leader_ttl)
        .value(serde_json::json!({"addr": "a"}))
        .campaign()
        .await?;
    match next(&mut changes).await? {
        LeaderChange::Elected(l) => ensure!(
            l.term == first.term()
                && l.owner == owner("leader")
                && l.value == Some(serde_json::json!({"addr": "a"})),
            "elected {l:?}, expected the leader's term {}",
            first.term()
        ),
        other => return Err(format!("expected the election, saw {other:?}").into()),
    }
    let standby = tokio::spawn(async move {
        let leadership = b
            .election("handover")
            .ttl(guard_ttl())
            .campaign_for(signal_bound() * 2)
            .await;
        (b, leadership)
    });
    // Held past several renewals (one every third of the TTL): the standby
    // must still be waiting.
    tokio::time::sleep(first.handle().granted_ttl()).await;
    first.check()?;
    ensure!(
        !standby.is_finished(),
        "a standby was elected while the leader led"
    );
    let term = first.term();
    first.resign().await?;
    let (_b, second) = standby.await?;
    let second = second?;
    ensure!(
        second.term() > term,
        "the standby's term {} is not above {term}",
        second.term()
    );
    let seen = next(&mut changes).await?;
    ensure!(
        seen == LeaderChange::Vacant {
            previous_term: term,
            expired: false
        },
        "expected the resignation of term {term}, saw {seen:?}"
    );
    let seen = next(&mut changes).await?;
    ensure!(
        matches!(seen, LeaderChange::Elected(ref l) if l.term == second.term()),
        "expected the standby's election, saw {seen:?}"
    );
    second.resign().await?;
    Ok(())
}

/// A leader cut off from the backend loses its leadership before its lease
/// ends; the lease then expires, an observer is told so (`expired: true`),
/// the standby is elected with a higher term, and the fence refuses the
/// deposed leader's term once the new leader has written.
pub async fn standby_takes_over_after_leader_expiry(store: &dyn Store) -> TestResult {
    let fence = super::fence_of(store).await?;
    let link = FaultyBackend::new(store.connect().await?);
    let a = LockClient::builder(link.clone())
        .owner(owner("cut-off"))
        .build()?;
    let (b, o) = (
        client(store, "standby").await?,
        client(store, "observer").await?,
    );
    let mut changes = o.election("crash").observe().await?;
    let first = a.election("crash").ttl(guard_ttl()).campaign().await?;
    let deposed = first.term();
    fence.admit("crash-resource", deposed).await?;
    let seen = next(&mut changes).await?;
    ensure!(
        matches!(seen, LeaderChange::Elected(ref l) if l.term == deposed),
        "expected the first election, saw {seen:?}"
    );
    let standby = tokio::spawn(async move {
        let leadership = b
            .election("crash")
            .ttl(guard_ttl())
            .campaign_for(signal_bound() * 2)
            .await;
        (b, leadership)
    });
    link.set(Fault::Refuse);
    let (_b, second) = standby.await?;
    let second = second?;
    // I5: the cut-off leader had stopped trusting its leadership before
    // the backend could elect anyone else.
    ensure!(
        !first.is_valid() && first.check().is_err(),
        "the cut-off leader still trusts term {deposed} while term {} leads",
        second.term()
    );
    ensure!(
        second.term() > deposed,
        "the new term {} is not above {deposed}",
        second.term()
    );
    let seen = next(&mut changes).await?;
    ensure!(
        seen == LeaderChange::Vacant {
            previous_term: deposed,
            expired: true
        },
        "expected the expiry of term {deposed}, saw {seen:?}"
    );
    let seen = next(&mut changes).await?;
    ensure!(
        matches!(seen, LeaderChange::Elected(ref l) if l.term == second.term()),
        "expected the standby's election, saw {seen:?}"
    );
    fence.admit("crash-resource", second.term()).await?;
    let refused = fence.admit("crash-resource", deposed).await;
    ensure!(
        matches!(refused, Err(Error::Stale { .. })),
        "the deposed leader's term {deposed} was answered {refused:?}"
    );
    second.resign().await?;
    drop(first);
    Ok(())
}

/// The next leader change, within [`signal_bound`].
async fn next(changes: &mut LeaderWatch) -> TestResult<LeaderChange> {
    match tokio::time::timeout(signal_bound(), changes.next()).await {
        Ok(Some(change)) => Ok(change?),
        Ok(None) => Err("the observation ended".into()),
        Err(_) => Err(format!("no leader change within {:?}", signal_bound()).into()),
    }
}
