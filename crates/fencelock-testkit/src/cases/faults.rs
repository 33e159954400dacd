//! Targeted fault scenarios, each played out against the
//! real backend: a holder cut off past its lease, a reply lost after the
//! grant committed, renewals slowed by the network, a wait that outlasts a
//! lease, a release by a holder that already lost its lease.
//!
//! Network faults come from a [`crate::proxy::FaultProxy`] between one
//! client and the server ([`Store::connect_via_proxy`]); every other client
//! reaches the server directly, as another process would. Stores without a
//! network (memory, SQLite) report those cases as ignored. The scenarios
//! that need processes (a stepped wall clock, a crashed holder) are in the
//! CLI's `tests/it/process_faults.rs`.
//!
//! What each scenario showed on each backend is in `docs/faults.md`.

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Backend, Error, Fence, FencingToken, LockClient, LockGuard, LockInfo, LossReason,
};
use tokio::{sync::Mutex, task::JoinHandle, time::Instant};

use super::{
    client, ensure, expiry_slack, fence_of, grant, guard_ttl, key, long_ttl, owner, released,
    short_ttl, SHORT_TTL_BASE,
};
use crate::{
    fault::{Fault, FaultyBackend},
    proxy::Direction,
    suite::{ProxiedBackend, Store, TestResult},
};

/// The protected resource of the scenarios: a value that holders read and
/// write only through a fence, admitting their token *before* the read
/// (`docs/semantics.md`, I7).
struct FencedCell {
    fence: Arc<dyn Fence>,
    value: Mutex<u64>,
}

impl FencedCell {
    const RESOURCE: &'static str = "storage";

    fn new(fence: Arc<dyn Fence>) -> Self {
        Self {
            fence,
            value: Mutex::new(0),
        }
    }

    async fn read(&self, token: FencingToken) -> fencelock_core::Result<u64> {
        self.fence.admit(Self::RESOURCE, token).await?;
        Ok(*self.value.lock().await)
    }

    async fn write(&self, token: FencingToken, value: u64) -> fencelock_core::Result<()> {
        // Holding the value across admit and store makes the pair one step,
        // as a fenced SQL write in one transaction is.
        let mut stored = self.value.lock().await;
        self.fence.admit(Self::RESOURCE, token).await?;
        *stored = value;
        Ok(())
    }
}

/// A client on `conn`, taking locks as `name`.
fn client_on(conn: &ProxiedBackend, name: &str) -> TestResult<LockClient> {
    Ok(LockClient::builder(Arc::clone(&conn.backend))
        .owner(owner(name))
        .build()?)
}

/// How long the backend makes a lease asked for as [`short_ttl`] (etcd
/// rounds up to whole seconds, with a minimum).
async fn granted_short_ttl(direct: &dyn Backend) -> TestResult<Duration> {
    granted_ttl(direct, short_ttl()).await
}

/// How long the backend makes a lease asked for as `ttl`.
async fn granted_ttl(direct: &dyn Backend, ttl: Duration) -> TestResult<Duration> {
    let probe = key("granted-ttl-probe");
    let g = grant(direct, &probe, &owner("probe"), ttl).await?;
    released(direct, &probe, &owner("probe"), g.token).await?;
    Ok(g.ttl)
}

/// Kleppmann's token 33/34 case with a real guard and a real partition: A
/// holds, admits its token and reads; then A is cut off from the backend (a
/// pause, as far as the lock is concerned: its renewals no longer arrive),
/// its lease runs out on the backend's clock, B acquires, admits and reads;
/// A comes back and writes what it computed before the pause. The fence
/// refuses A's write, B's increment lands, nothing is lost.
///
/// Needs a network to cut. On memory and SQLite the same story, with a
/// holder that simply stops renewing, is `fence::i7_admit_before_read_prevents_lost_update`.
pub async fn paused_holder_write_is_refused(store: &dyn Store) -> TestResult {
    let cell = FencedCell::new(fence_of(store).await?);
    let a_conn = store.connect_via_proxy().await?;
    let a = client_on(&a_conn, "a")?;
    let b = client(store, "b").await?;
    let a_guard = a.lock("kleppmann").ttl(short_ttl()).acquire().await?;
    let a_read = cell.read(a_guard.token()).await?;

    a_conn.proxy.partition();
    let b_guard = b
        .lock("kleppmann")
        .ttl(long_ttl())
        .wait(a_guard.granted_ttl() + expiry_slack())
        .acquire()
        .await?;
    ensure!(
        !a_guard.is_valid(),
        "B got token {} while A's guard (token {}) still trusted its lease",
        b_guard.token(),
        a_guard.token()
    );
    ensure!(
        b_guard.token() > a_guard.token(),
        "B's token {} is not above A's {}",
        b_guard.token(),
        a_guard.token()
    );
    let b_read = cell.read(b_guard.token()).await?;

    // A resumes and writes the increment it computed before the pause.
    a_conn.proxy.heal();
    match cell.write(a_guard.token(), a_read + 1).await {
        Err(Error::Stale {
            presented, current, ..
        }) => ensure!(
            presented == a_guard.token() && current == b_guard.token(),
            "Stale reported presented {presented}, current {current}"
        ),
        other => {
            return Err(format!(
                "A's write with token {} after B admitted {} gave {other:?}",
                a_guard.token(),
                b_guard.token()
            )
            .into())
        }
    }
    cell.write(b_guard.token(), b_read + 1).await?;
    let value = *cell.value.lock().await;
    ensure!(value == 1, "the counter is {value}, expected 1");

    // A's guard had given up at its own deadline: it was cut off, so no
    // refusal could reach it.
    let reason = tokio::time::timeout(expiry_slack(), a_guard.lost())
        .await
        .map_err(|_| "A's guard never reported the loss")?;
    ensure!(
        reason == LossReason::Deadline,
        "A's loss reason is {reason:?}"
    );
    b_guard.release().await?;
    Ok(())
}

/// The holder takes `name` for twice as long as the waiter will ask for and
/// lets it run out; the waiter waits the whole time, longer than its own
/// lease would last, and must come back with a lease the backend still has.
async fn outwait(
    direct: &dyn Backend,
    waiter: &LockClient,
    name: &str,
    short: Duration,
) -> TestResult<LockGuard> {
    let k = key(name);
    let held = grant(direct, &k, &owner("holder"), short * 2).await?;
    let guard = waiter
        .lock(name)
        .ttl(short_ttl())
        .auto_renew(false)
        .wait(held.ttl + expiry_slack())
        .acquire()
        .await?;
    ensure_fresh(&guard, direct).await?;
    ensure!(
        guard.token() > held.token,
        "token {} after the holder's {}",
        guard.token(),
        held.token
    );
    Ok(guard)
}

/// Releases a short lease that `outwait` checked. On a loaded machine the
/// lease may end between that check and the release's arrival (it is
/// `short_ttl()` long and, under latency, the release travels through the
/// proxy), and the backend then rightly answers `NotHeld`; what must hold
/// either way is that the backend no longer has it.
async fn hand_back(direct: &dyn Backend, guard: LockGuard) -> TestResult {
    let (k, token) = (guard.key().clone(), guard.token());
    match guard.release().await {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let left = direct.inspect(&k).await?;
    ensure!(
        left.as_ref()
            .is_none_or(|l| l.token != token || l.expires_in.is_zero()),
        "after the release the backend still has a live lease with token {token}: {left:?}"
    );
    Ok(())
}

/// A guard `acquire` just returned is trusted for a while, and while it is,
/// the backend has its lease (I5 seen from the backend's side).
async fn ensure_fresh(guard: &LockGuard, direct: &dyn Backend) -> TestResult {
    let remaining = guard.remaining();
    ensure!(
        !remaining.is_zero(),
        "acquire returned token {} with a lease the guard no longer trusts",
        guard.token()
    );
    ensure!(
        remaining <= guard.granted_ttl(),
        "the guard trusts {remaining:?} of a {:?} lease",
        guard.granted_ttl()
    );
    let lease = direct.inspect(guard.key()).await?;
    // Asked after the answer arrived: if the guard still trusts its lease
    // now, it did when the backend answered.
    if guard.is_valid() {
        match lease {
            Some(l) if l.token == guard.token() && !l.expires_in.is_zero() => {}
            other => {
                return Err(format!(
                    "the guard trusts token {} but the backend has {other:?}",
                    guard.token()
                )
                .into())
            }
        }
    }
    Ok(())
}

/// A waiter whose wait outlives the lease it asks for never comes back with
/// a lease that already ended: the lease starts when the grant is made, not
/// when the wait began (the complaint of etcd-io/etcd issue 19597), and the guard trusts it
/// from the instant the winning request left.
pub async fn waiter_never_gets_an_expired_lease(store: &dyn Store) -> TestResult {
    let direct = store.connect().await?;
    let short = granted_short_ttl(&*direct).await?;
    let waiter = client(store, "waiter").await?;
    let guard = outwait(&*direct, &waiter, "long-wait", short).await?;
    hand_back(&*direct, guard).await
}

/// The same under added latency: with latency well inside the lease the
/// wait ends with a fresh lease; with a round trip longer than the lease,
/// every grant reaches the client after the lease it reports has ended, so
/// `acquire` must fail (and hand the useless grant back) rather than return
/// a guard that was never valid.
pub async fn waiter_never_gets_an_expired_lease_under_latency(store: &dyn Store) -> TestResult {
    let direct = store.connect().await?;
    let short = granted_short_ttl(&*direct).await?;
    let conn = store.connect_via_proxy().await?;
    let waiter = client_on(&conn, "waiter")?;

    conn.proxy
        .set_latency(Direction::Both, short / 16, short / 40);
    let guard = outwait(&*direct, &waiter, "slow-wait", short).await?;
    hand_back(&*direct, guard).await?;

    // Each way half the lease and a bit: the reply arrives after the lease
    // it carries has ended, even if the backend granted it the moment the
    // request arrived. The lease is the unscaled base: a busy machine only
    // makes the reply later still, while a latency scaled with the budget
    // would outgrow figures the backends fix (a ZooKeeper session's
    // liveness check), and the grant could not be handed back.
    let slow = granted_ttl(&*direct, SHORT_TTL_BASE).await?;
    conn.proxy.set_latency(
        Direction::Both,
        slow / 2 + Duration::from_millis(50),
        Duration::ZERO,
    );
    let result = waiter
        .lock("too-slow")
        .ttl(SHORT_TTL_BASE)
        .auto_renew(false)
        .acquire()
        .await;
    match result {
        Ok(guard) => {
            return Err(format!(
                "acquire returned token {} over a round trip longer than its lease \
                 (valid: {}, remaining {:?})",
                guard.token(),
                guard.is_valid(),
                guard.remaining()
            )
            .into())
        }
        Err(e) => ensure!(e.is_transient(), "acquire failed permanently: {e}"),
    }
    let left = direct.inspect(&key("too-slow")).await?;
    ensure!(
        left.is_none(),
        "the grant that came back too late was left to expire: {left:?}"
    );
    Ok(())
}

/// Until when replies are held back while a case watches a grant commit.
/// A fixed figure, not the budget's: it must stay below figures the
/// backends fix themselves (etcd's least lease of about 2 s, which the
/// grant must outlive until its next step; a driver's handshake bounded
/// at 5 s, whose replies it also holds; a ZooKeeper session that gives up
/// on a connection silent for two thirds of 10 s). The direct watch that
/// must see the grant within it polls every 5 ms.
fn reply_hold() -> Duration {
    Duration::from_secs(1)
}

/// Starts `acquire` of `name` on a proxied client and makes sure the grant
/// commits on the backend but its reply never reaches the client: replies
/// are delayed by [`reply_hold`], the case watches the lease appear through
/// a direct connection, and resets the proxied connections before the reply
/// is delivered. Returns the orphaned lease and the still-running acquire.
async fn lose_grant_reply(
    store: &dyn Store,
    direct: &dyn Backend,
    name: &'static str,
    wait: Duration,
) -> TestResult<(
    LockInfo,
    JoinHandle<fencelock_core::Result<LockGuard>>,
    ProxiedBackend,
)> {
    let conn = store.connect_via_proxy().await?;
    let c = client_on(&conn, "c")?;
    // Open the wake-up channel on a healthy network, so that the delayed
    // replies are those of the grant.
    if wait > Duration::ZERO {
        c.lock("warm-up")
            .wait(long_ttl())
            .acquire()
            .await?
            .release()
            .await?;
    }
    conn.proxy
        .set_latency(Direction::ToClient, reply_hold(), Duration::ZERO);
    let attempt = tokio::spawn(async move {
        c.lock(name)
            .ttl(short_ttl())
            .auto_renew(false)
            .wait(wait)
            .acquire()
            .await
    });
    let bound = Instant::now() + super::patient(reply_hold() * 10);
    let orphan = loop {
        match direct.inspect(&key(name)).await? {
            Some(lease) if lease.owner == owner("c") => break lease,
            _ => ensure!(
                Instant::now() < bound,
                "the proxied client's grant of {name} never showed on the backend"
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    conn.proxy.reset_all();
    conn.proxy.heal();
    Ok((orphan, attempt, conn))
}

/// An acquire whose reply is lost after the grant committed (the client
/// cannot tell whether it holds the lock) is resolved without a lock stuck
/// past its TTL: a single attempt fails and the orphaned lease runs out, so
/// another client acquires within its TTL; an attempt that may wait retries,
/// finds the orphan (it is not reentrant, even for its own owner), and gets
/// a new grant once the orphan has expired.
pub async fn ambiguous_acquire_is_resolved(store: &dyn Store) -> TestResult {
    let direct = store.connect().await?;
    let short = granted_short_ttl(&*direct).await?;
    let rival = client(store, "rival").await?;

    let (orphan, attempt, _conn) =
        lose_grant_reply(store, &*direct, "ambiguous-once", Duration::ZERO).await?;
    match attempt.await? {
        // Not `Timeout`: no answer said the key was held.
        Err(e) => ensure!(e.is_transient(), "the lost reply gave {e:?}"),
        Ok(guard) => {
            return Err(format!(
                "acquire succeeded with token {} although its reply for token {} was lost",
                guard.token(),
                orphan.token
            )
            .into())
        }
    }
    let taken = rival
        .lock("ambiguous-once")
        .ttl(long_ttl())
        .wait(orphan.expires_in + expiry_slack())
        .acquire()
        .await
        .map_err(|e| format!("the orphaned lease {} was never freed: {e}", orphan.token))?;
    ensure!(
        taken.token() > orphan.token,
        "token {} after the orphan's {}",
        taken.token(),
        orphan.token
    );
    taken.release().await?;

    let (orphan, attempt, _conn) = lose_grant_reply(
        store,
        &*direct,
        "ambiguous-retried",
        short * 2 + expiry_slack(),
    )
    .await?;
    let guard = attempt
        .await?
        .map_err(|e| format!("the retried acquire failed: {e}"))?;
    ensure!(
        guard.token() > orphan.token,
        "the retry returned token {}, the orphan's is {}",
        guard.token(),
        orphan.token
    );
    ensure_fresh(&guard, &*direct).await?;
    ensure!(
        rival
            .lock("ambiguous-retried")
            .try_acquire()
            .await?
            .is_none(),
        "the rival got the lock the retry holds"
    );
    guard.release().await?;
    Ok(())
}

/// What a direct connection saw of a lease until it was gone, on the local
/// monotonic clock.
struct Watched {
    /// No earlier than this the backend ended the lease: every answer that
    /// showed it was given after its question was sent, with the backend's
    /// own countdown (so a slow answer costs precision, never soundness).
    ends_after: Instant,
    /// The first answer without the lease.
    gone_at: Instant,
}

/// Polls `key` on `direct` until the lease with `token` is gone.
async fn watch_until_gone(
    direct: Arc<dyn Backend>,
    k: fencelock_core::LockKey,
    token: FencingToken,
    bound: Duration,
) -> TestResult<Option<Watched>> {
    let give_up = Instant::now() + bound;
    let mut ends_after = None;
    loop {
        let sent = Instant::now();
        let lease = direct.inspect(&k).await?;
        let answered = Instant::now();
        match lease {
            Some(l) if l.token == token => {
                let end = sent + l.expires_in;
                ends_after = Some(ends_after.map_or(end, |e: Instant| e.max(end)));
            }
            _ => {
                return Ok(ends_after.map(|ends_after| Watched {
                    ends_after,
                    gone_at: answered,
                }))
            }
        }
        ensure!(
            answered < give_up,
            "lease {token} on {k} outlived {bound:?} of watching"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits for `guard` to report its loss while watching its lease from a
/// direct connection, and checks that the loss came first: before the
/// earliest instant at which the backend can have ended the lease. Returns
/// a line for the report.
async fn loss_precedes_expiry(
    guard: &LockGuard,
    direct: &Arc<dyn Backend>,
    what: &str,
) -> TestResult<String> {
    let bound = guard.granted_ttl() * 10 + expiry_slack();
    let watcher = tokio::spawn(watch_until_gone(
        Arc::clone(direct),
        guard.key().clone(),
        guard.token(),
        bound,
    ));
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| format!("{what}: the guard never reported a loss"))?;
    // The instant the guard stopped trusting its lease (I5), not when this
    // task woke to hear of it: a busy machine may wake it late, and what
    // the case checks is the guard's belief, which `is_valid` ends there.
    let lost_at = guard.trusted_until();
    ensure!(
        reason == LossReason::Deadline,
        "{what}: loss reason {reason:?}"
    );
    let watched = watcher
        .await??
        .ok_or_else(|| format!("{what}: the lease was gone before the first look"))?;
    ensure!(
        watched.ends_after > lost_at,
        "{what}: the backend's lease may have ended before the guard noticed: relative \
         to the loss, its earliest end was at {:+.1} ms, seen gone at {:+.1} ms",
        signed_ms(watched.ends_after, lost_at),
        signed_ms(watched.gone_at, lost_at)
    );
    Ok(format!(
        "{what}: loss noticed {:.0}–{:.0} ms before the backend's expiry",
        ms(watched.ends_after - lost_at),
        ms(watched.gone_at - lost_at),
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `t - origin` in milliseconds, negative when `t` came first.
fn signed_ms(t: Instant, origin: Instant) -> f64 {
    if t >= origin {
        ms(t - origin)
    } else {
        -ms(origin - t)
    }
}

/// Renewal under added latency. Moderate latency: renewals keep the lease.
/// Then a partition with the latency still on (the tightest case: the last
/// renewal's request spent its one-way delay before the backend started the
/// lease, and nothing extends it after): the guard must report the loss
/// before the backend's lease ends. Then a latency so high that every
/// renewal is abandoned on the client; where the server still receives an
/// abandoned renewal (Redis, etcd) it extends the lease there, so the guard
/// gives up long before the backend.
///
/// The assertion is the safety inequality alone, with the backend's expiry
/// observed through a direct connection; the margins are printed (with
/// `--nocapture`) and recorded in `docs/faults.md`, never asserted.
pub async fn renewal_under_latency_loses_before_expiry(store: &dyn Store) -> TestResult {
    let direct = store.connect().await?;
    let conn = store.connect_via_proxy().await?;
    let holder = client_on(&conn, "slow")?;
    let mut report = Vec::new();

    let guard = holder
        .lock("partitioned")
        .ttl(guard_ttl())
        .acquire()
        .await?;
    let ttl = guard.granted_ttl();
    conn.proxy.set_latency(Direction::Both, ttl / 40, ttl / 100);
    tokio::time::sleep(ttl * 3 / 2).await;
    guard.check()?;
    match direct.inspect(guard.key()).await? {
        Some(l) if l.token == guard.token() => {}
        other => return Err(format!("renewals under latency lost the lease: {other:?}").into()),
    }
    conn.proxy.partition();
    report.push(loss_precedes_expiry(&guard, &direct, "latency then partition").await?);

    // A connection of its own: the partitioned one lost bytes, so healing
    // would reset it, and a single attempt on a reset connection may fail.
    let conn = store.connect_via_proxy().await?;
    let holder = client_on(&conn, "slower")?;
    let guard = holder.lock("slowed").ttl(guard_ttl()).acquire().await?;
    let ttl = guard.granted_ttl();
    // A round trip beyond a third of the TTL: each renewal is abandoned on
    // the client, which waits at most ttl/3 for it.
    conn.proxy.set_latency(Direction::Both, ttl / 4, ttl / 20);
    report.push(loss_precedes_expiry(&guard, &direct, "latency beyond ttl/6 each way").await?);

    for line in report {
        println!("faults::renewal_under_latency [{}]: {line}", direct.name());
    }
    Ok(())
}

/// A holder whose lease expired (its renewals could not get through) and
/// was taken over by a successor *of the same owner name* releases and
/// renews: both are refused, and the successor still holds with its token.
/// Runs on every backend: the holder is cut off by a wrapper that leaves its
/// backend calls hanging, not by the network.
pub async fn expired_holder_release_has_no_effect(store: &dyn Store) -> TestResult {
    let direct = store.connect().await?;
    let faulty = FaultyBackend::new(store.connect().await?);
    let same = owner("same-name");
    let a = LockClient::builder(faulty.clone())
        .owner(same.clone())
        .build()?;
    let b = LockClient::builder(store.connect().await?)
        .owner(same.clone())
        .build()?;
    let a_guard = a.lock("stale-release").ttl(short_ttl()).acquire().await?;
    let a_token = a_guard.token();
    faulty.set(Fault::Hang);
    let b_guard = b
        .lock("stale-release")
        .ttl(long_ttl())
        .wait(a_guard.granted_ttl() + expiry_slack())
        .acquire()
        .await?;
    faulty.set(Fault::None);
    ensure!(
        !a_guard.is_valid(),
        "the successor got token {} while the old guard trusted token {a_token}",
        b_guard.token()
    );

    let renewed = a_guard.renew().await;
    ensure!(
        matches!(renewed, Err(Error::LockLost { .. })),
        "the old guard renewed: {renewed:?}"
    );
    let a_released = a_guard.release().await;
    ensure!(
        matches!(a_released, Err(Error::NotHeld { .. })),
        "the old guard's release gave {a_released:?}"
    );
    // What a retried release or `fencelock release --owner --token` sends.
    let k = key("stale-release");
    ensure!(
        !released(&*faulty, &k, &same, a_token).await?,
        "a release with the old token removed a lease"
    );

    let lease = direct
        .inspect(&k)
        .await?
        .ok_or("the successor's lease vanished")?;
    ensure!(
        lease.token == b_guard.token() && lease.owner == same,
        "the lease is {lease:?}, expected the successor's token {}",
        b_guard.token()
    );
    b_guard.renew().await?;
    b_guard.check()?;
    b_guard.release().await?;
    Ok(())
}
