//! Read-write locks (`docs/rwlock.md`): readers share, a writer (or a plain
//! lock) excludes everyone, tokens of both sides come from one counter, a
//! waiting writer's intent stops new readers and ends with the writer, and
//! reader leases are renewed and released by exact (key, owner, token).
//!
//! Every case runs on every backend: where the backend does not claim
//! `shared`, the case checks that the reader's side is refused with
//! `Unsupported` and stops there.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{
    Acquire, Backend, Error, Fence, FencingToken, LockClient, LockKey, LockMode, Owner, Renewal,
    WriteIntents,
};

use super::{
    client, ensure, expiry_slack, fence_of, grant, guard_ttl, key, lease, long_ttl, owner, request,
    short_ttl, through_restart, wait_out,
};
use crate::suite::{Store, TestResult};

/// How long a waiter in these cases may wait before the case calls it stuck.
fn long_wait() -> Duration {
    super::patient(Duration::from_secs(60))
}

/// `Ok(true)` when the store claims shared locks. Otherwise checks that
/// every reader operation is refused with `Unsupported` (never ignored, never
/// turned into an exclusive lock) and answers `Ok(false)`.
async fn shared_or_refused(store: &dyn Store) -> TestResult<bool> {
    let b = store.connect().await?;
    if b.capabilities().shared {
        ensure!(
            b.write_intents().is_some(),
            "shared claimed without writer intents"
        );
        return Ok(true);
    }
    let (k, o) = (key("rw-unsupported"), owner("reader"));
    let unsupported = |r: &fencelock_core::Result<()>| matches!(r, Err(Error::Unsupported(_)));
    let acquired = b.try_acquire(&reader_request(&k, &o, long_ttl())).await;
    ensure!(
        matches!(acquired, Err(Error::Unsupported(_))),
        "a reader's try_acquire without the claim: {acquired:?}"
    );
    ensure!(
        b.write_intents().is_none(),
        "writer intents offered without the claim"
    );
    // A reader's lease this backend never granted: refused, or not held.
    let l = reader_lease(&k, &o, FencingToken(1));
    let refused = |r: &fencelock_core::Result<()>| unsupported(r) || not_held(r);
    let renewed = b.renew(&l, long_ttl()).await.map(|_| ());
    let released = b.release(&l).await;
    for (what, r) in [("renew", renewed), ("release", released)] {
        ensure!(refused(&r), "a reader's {what} without the claim: {r:?}");
    }
    let c = LockClient::builder(b).owner(o).build()?;
    let read = c.rwlock("rw-unsupported").read().try_acquire().await;
    ensure!(
        matches!(read, Err(Error::Unsupported(_))),
        "a read lock without the claim: {read:?}"
    );
    // The writer's side is a plain lock, on every backend.
    let write = c.rwlock("rw-unsupported").write().try_acquire().await?;
    ensure!(
        write.is_some(),
        "the writer's side of a free key was refused"
    );
    Ok(false)
}

/// A reader's request for `k`.
fn reader_request(k: &LockKey, o: &Owner, ttl: Duration) -> fencelock_core::AcquireRequest {
    request(k, o, ttl).with_mode(LockMode::Shared)
}

/// The reader's lease of `o` on `k` granted `token`.
fn reader_lease(k: &LockKey, o: &Owner, token: FencingToken) -> fencelock_core::LeaseId {
    lease(k, o, token).with_mode(LockMode::Shared)
}

/// `b`'s writer intents (shared locks are claimed).
fn intents(b: &dyn Backend) -> TestResult<&dyn WriteIntents> {
    b.write_intents()
        .ok_or_else(|| "shared claimed without writer intents".into())
}

/// `NotHeld`.
fn not_held(r: &fencelock_core::Result<()>) -> bool {
    matches!(r, Err(Error::NotHeld { .. }))
}

/// A reader's `try_acquire` that must be granted.
async fn read_grant(
    b: &dyn Backend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
) -> TestResult<fencelock_core::Grant> {
    match b.try_acquire(&reader_request(k, o, ttl)).await? {
        Acquire::Granted(g) => Ok(g),
        Acquire::Held(h) => Err(format!("reader {o} refused on {k}: {h:?}").into()),
    }
}

/// Two readers (two clients) hold one key at once; a writer and a plain
/// lock are refused while they do, told a reader holds it; the holders
/// are listed as shared; once both release, a writer gets a higher token
/// than either, and then readers and other writers are refused.
pub async fn readers_share_and_exclude_writers(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let (a, b) = (client(store, "rw-a").await?, client(store, "rw-b").await?);
    let w = client(store, "rw-w").await?;
    let ra = a.rwlock("rw").read().ttl(long_ttl()).acquire().await?;
    let rb = b.rwlock("rw").read().ttl(long_ttl()).acquire().await?;
    ensure!(
        ra.mode() == LockMode::Shared && rb.token() > ra.token(),
        "readers: {ra:?} {rb:?}"
    );
    ensure!(
        w.rwlock("rw").write().try_acquire().await?.is_none(),
        "a writer was granted while two readers held the key"
    );
    ensure!(
        w.try_lock("rw").await?.is_none(),
        "a plain lock was granted while two readers held the key"
    );
    let backend = store.connect().await?;
    match backend
        .try_acquire(&request(&key("rw"), &owner("rw-w"), long_ttl()))
        .await?
    {
        Acquire::Held(Some(h)) => ensure!(
            h.mode == LockMode::Shared && (h.token == ra.token() || h.token == rb.token()),
            "the writer was told it waits for {h:?}"
        ),
        other => return Err(format!("a writer during reads got {other:?}").into()),
    }
    let holders = w.holders("rw").await?;
    let tokens: Vec<_> = holders.iter().map(|h| (h.token, h.mode)).collect();
    ensure!(
        tokens
            == [
                (ra.token(), LockMode::Shared),
                (rb.token(), LockMode::Shared)
            ],
        "holders of rw: {holders:?}"
    );
    ensure!(
        w.validate("rw", ra.token()).await? && w.validate("rw", rb.token()).await?,
        "a current reader's token did not validate"
    );
    let top = rb.token();
    ra.release().await?;
    ensure!(
        w.rwlock("rw").write().try_acquire().await?.is_none(),
        "a writer was granted while one reader held the key"
    );
    rb.release().await?;
    let writer = w.rwlock("rw").write().ttl(long_ttl()).acquire().await?;
    ensure!(
        writer.token() > top && writer.mode() == LockMode::Exclusive,
        "writer {writer:?} after readers up to {top}"
    );
    ensure!(
        a.rwlock("rw").read().try_acquire().await?.is_none(),
        "a reader was granted while a writer held the key"
    );
    ensure!(
        a.rwlock("rw").write().try_acquire().await?.is_none() && a.try_lock("rw").await?.is_none(),
        "a second writer was granted"
    );
    writer.release().await?;
    Ok(())
}

/// Tokens strictly increase across modes: write, read, read, write, read.
pub async fn tokens_increase_across_modes(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let c = client(store, "rw-tokens").await?;
    let mut last = FencingToken(0);
    for shared in [false, true, true, false, true] {
        let guard = c
            .lock("rw-tokens")
            .shared(shared)
            .ttl(long_ttl())
            .acquire()
            .await?;
        ensure!(
            guard.token() > last,
            "{} token {} after {last}",
            guard.mode(),
            guard.token()
        );
        last = guard.token();
        guard.release().await?;
    }
    Ok(())
}

/// A waiting writer's intent stops new readers (no starvation), the writer
/// is served when the readers it found leave, and new readers come back
/// after it. An intent of a writer that died is a lease: it ends by expiry;
/// a withdrawn one frees readers at once.
pub async fn writer_intent_blocks_new_readers_and_expires(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let (r1, r2) = (client(store, "rw-r1").await?, client(store, "rw-r2").await?);
    let w = client(store, "rw-writer").await?;
    let first = r1
        .rwlock("rw-intent")
        .read()
        .ttl(long_ttl())
        .acquire()
        .await?;
    let waiting = tokio::spawn(async move {
        w.rwlock("rw-intent")
            .write()
            .ttl(long_ttl())
            .wait(long_wait())
            .acquire()
            .await
    });
    // Readers keep coming until the writer has posted its intent; from
    // then on each is refused.
    let bound = tokio::time::Instant::now() + long_wait();
    let mut admitted = Vec::new();
    loop {
        match r2
            .rwlock("rw-intent")
            .read()
            .ttl(long_ttl())
            .try_acquire()
            .await?
        {
            Some(reader) => admitted.push(reader),
            None => break,
        }
        ensure!(
            tokio::time::Instant::now() < bound && !waiting.is_finished(),
            "new readers kept being admitted while a writer waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ensure!(
        !waiting.is_finished(),
        "the writer got the key under readers"
    );
    first.release().await?;
    for reader in admitted {
        reader.release().await?;
    }
    let writer = waiting.await??;
    ensure!(
        r2.rwlock("rw-intent").read().try_acquire().await?.is_none(),
        "a reader was granted while the writer held the key"
    );
    writer.release().await?;
    let after = r2.rwlock("rw-intent").read().try_acquire().await?;
    ensure!(after.is_some(), "the granted writer's intent outlived it");
    drop(after);

    // Through the backend. A live intent stops readers; another writer's
    // intent neither replaces it nor withdraws it; its owner's withdrawal
    // frees readers at once.
    let b = store.connect().await?;
    let (k, dead, other) = (key("rw-dead-writer"), owner("rw-dead"), owner("rw-other"));
    let reader = owner("rw-late-reader");
    let refused = |answer: Acquire| matches!(answer, Acquire::Held(_));
    intents(&*b)?
        .post_write_intent(&k, &dead, long_ttl())
        .await?;
    intents(&*b)?
        .post_write_intent(&k, &other, long_ttl())
        .await?;
    intents(&*b)?.withdraw_write_intent(&k, &other).await?;
    ensure!(
        refused(
            b.try_acquire(&reader_request(&k, &reader, long_ttl()))
                .await?
        ),
        "a reader was granted under a live writer intent"
    );
    intents(&*b)?.withdraw_write_intent(&k, &dead).await?;
    let g = read_grant(&*b, &k, &reader, long_ttl()).await?;
    b.release(&reader_lease(&k, &reader, g.token)).await?;
    // The intent of a writer that never comes back ends by expiry.
    intents(&*b)?
        .post_write_intent(&k, &dead, short_ttl())
        .await?;
    let bound = tokio::time::Instant::now() + short_ttl() + expiry_slack();
    loop {
        if let Acquire::Granted(g) = b
            .try_acquire(&reader_request(&k, &reader, long_ttl()))
            .await?
        {
            b.release(&reader_lease(&k, &reader, g.token)).await?;
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < bound,
            "a dead writer's intent of {:?} still stopped readers {:?} later",
            short_ttl(),
            expiry_slack()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reader that stops renewing (a crash) frees the key for a writer by
/// expiry, with no cleanup; the writer's token is higher.
pub async fn reader_expiry_frees_the_writer(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let k = key("rw-expiry");
    // Long enough that the writer's first try surely meets it.
    let g = read_grant(&*b, &k, &owner("rw-crashed"), guard_ttl()).await?;
    ensure!(
        matches!(
            b.try_acquire(&request(&k, &owner("rw-w"), long_ttl()))
                .await?,
            Acquire::Held(_)
        ),
        "a writer was granted under a live reader"
    );
    tokio::time::sleep(g.ttl).await;
    let bound = tokio::time::Instant::now() + expiry_slack();
    loop {
        if let Acquire::Granted(w) = b
            .try_acquire(&request(&k, &owner("rw-w"), long_ttl()))
            .await?
        {
            ensure!(
                w.token > g.token,
                "writer {} after reader {}",
                w.token,
                g.token
            );
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < bound,
            "a {:?} reader lease still held off the writer {:?} after its TTL",
            g.ttl,
            expiry_slack()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// I3 for readers: only the exact (key, owner, token) renews or releases a
/// reader lease; the exclusive operations do not touch it, nor the reader
/// operations an exclusive lease; a batch answers each reader in order; a
/// reader guard outlives its TTL by renewal.
pub async fn reader_lease_ownership_is_exact(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let (k, o) = (key("rw-own"), owner("rw-owner"));
    let g = read_grant(&*b, &k, &o, long_ttl()).await?;
    let stranger = reader_lease(&k, &owner("rw-stranger"), g.token);
    let stale = reader_lease(&k, &o, FencingToken(g.token.get() - 1));
    let mine = reader_lease(&k, &o, g.token);
    for (what, l) in [("stranger", &stranger), ("stale token", &stale)] {
        ensure!(
            not_held(&b.renew(l, long_ttl()).await.map(|_| ())),
            "{what} renewed a reader lease"
        );
        ensure!(
            not_held(&b.release(l).await),
            "{what} released a reader lease"
        );
    }
    // The same lease named as an exclusive one.
    let as_writer = lease(&k, &o, g.token);
    ensure!(
        not_held(&b.renew(&as_writer, long_ttl()).await.map(|_| ()))
            && not_held(&b.release(&as_writer).await),
        "the exclusive operations touched a reader lease"
    );
    // One batch mixing both sides answers each in order.
    let w_key = key("rw-own-writer");
    let w = grant(&*b, &w_key, &o, long_ttl()).await?;
    let other_writer = lease(&w_key, &o, w.token);
    let answers = b
        .renew_many(&[
            Renewal::new(mine.clone(), long_ttl()),
            Renewal::new(other_writer.clone(), long_ttl()),
            Renewal::new(stale.clone(), long_ttl()),
        ])
        .await?;
    ensure!(
        matches!(answers.as_slice(),
            [Ok(r), Ok(x), Err(Error::NotHeld { .. })] if r.token == g.token && x.token == w.token),
        "a mixed renew_many answered {answers:?}"
    );
    b.release(&other_writer).await?;
    b.release(&mine).await?;
    ensure!(
        not_held(&b.release(&mine).await),
        "a reader lease was released twice"
    );
    let w = grant(&*b, &k, &o, long_ttl()).await?;
    let writer = lease(&k, &o, w.token);
    let writer_as_reader = writer.clone().with_mode(LockMode::Shared);
    ensure!(
        not_held(&b.renew(&writer_as_reader, long_ttl()).await.map(|_| ()))
            && not_held(&b.release(&writer_as_reader).await),
        "the reader operations touched an exclusive lease"
    );
    b.release(&writer).await?;

    let c = client(store, "rw-renewed").await?;
    let guard = c
        .rwlock("rw-renew")
        .read()
        .ttl(guard_ttl())
        .acquire()
        .await?;
    tokio::time::sleep(guard_ttl() + guard_ttl() / 2).await;
    guard.check()?;
    ensure!(
        c.validate("rw-renew", guard.token()).await?,
        "a renewed reader is no longer a holder"
    );
    guard.release().await?;
    Ok(())
}

/// The operator calls see readers: `list` and `stats` count each, and
/// `release_all` frees an owner's readers, `force_release` every lease on
/// the key, `cleanup` expired readers without lowering a later token.
pub async fn admin_accounts_for_readers(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let b = store.connect().await?;
    let (k, a, z) = (key("rw-admin"), owner("rw-admin-a"), owner("rw-admin-z"));
    let ga = read_grant(&*b, &k, &a, long_ttl()).await?;
    let gz = read_grant(&*b, &k, &z, long_ttl()).await?;
    let listed = b.administer()?.list(Some("rw-admin")).await?;
    ensure!(
        listed.len() == 2 && listed.iter().all(|l| l.mode == LockMode::Shared),
        "list: {listed:?}"
    );
    let stats = b.administer()?.stats().await?;
    ensure!(
        stats.held == 2 && stats.held_by_owner.get(a.as_str()) == Some(&1),
        "stats: {stats:?}"
    );
    ensure!(
        b.administer()?.release_all(&a).await? == 1,
        "release_all freed another count"
    );
    ensure!(
        b.release(&reader_lease(&k, &a, ga.token)).await.is_err(),
        "release_all left the reader of its owner"
    );
    let forced = b.administer()?.force_release(&k).await?;
    ensure!(
        forced.is_some_and(|f| f.token == gz.token && f.mode == LockMode::Shared),
        "force_release of a read-held key reported nothing"
    );
    ensure!(
        b.administer()?.list(Some("rw-admin")).await?.is_empty(),
        "force_release left readers"
    );
    let short = read_grant(&*b, &k, &a, short_ttl()).await?;
    wait_out(&*b, &k, &short).await?;
    b.administer()?.cleanup_expired().await?;
    let after = grant(&*b, &k, &a, long_ttl()).await?;
    ensure!(
        after.token > short.token,
        "token {} after cleanup of {}",
        after.token,
        short.token
    );
    Ok(())
}

/// Twelve workers on three connections take the read or the write side of
/// one key, 6 times each: at any moment only readers or one writer hold
/// it, and every holder's token is admitted by the fence in its mode
/// (a legitimate holder is never refused) when the fence understands
/// read-write locks.
pub async fn race_of_readers_and_writers(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let fence: Option<Arc<dyn Fence>> = match store.fence().await? {
        Some(f) if f.shared() => Some(f),
        _ => None,
    };
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(client(store, &format!("rw-racer-{i}")).await?);
    }
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for i in 0..12 {
        let client = clients[i % clients.len()].clone();
        let (readers, writers, most_readers) = (
            Arc::clone(&readers),
            Arc::clone(&writers),
            Arc::clone(&most_readers),
        );
        let fence = fence.clone();
        workers.push(tokio::spawn(async move {
            for round in 0..6 {
                // Two thirds readers: enough overlap for readers to share.
                let shared = (i + round) % 3 != 0;
                let guard = client
                    .lock("rw-race")
                    .shared(shared)
                    .ttl(long_ttl())
                    .wait(long_wait())
                    .acquire()
                    .await?;
                let (mine, others) = if shared {
                    (&readers, &writers)
                } else {
                    (&writers, &readers)
                };
                let now = mine.fetch_add(1, Ordering::SeqCst) + 1;
                let violation = others.load(Ordering::SeqCst) > 0 || (!shared && now > 1);
                if shared {
                    most_readers.fetch_max(now, Ordering::SeqCst);
                }
                let admitted = match &fence {
                    Some(f) => f.admit_shared("rw-race", guard.token(), guard.mode()).await,
                    None => Ok(()),
                };
                tokio::task::yield_now().await;
                mine.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
                if violation {
                    return Err(format!(
                        "a {} held rw-race with readers or another writer",
                        if shared { "reader" } else { "writer" }
                    )
                    .into());
                }
                admitted?;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    ensure!(
        most_readers.load(Ordering::SeqCst) >= 1,
        "no reader ever held the key"
    );
    Ok(())
}

/// `admit_shared`: a writer's token must reach the highest admitted in
/// either mode, a reader's only the highest writer token; plain `admit` is
/// the writer's admission. Fences that do not understand read-write locks
/// refuse with `Unsupported`.
pub async fn fence_admits_readers_and_writers(store: &dyn Store) -> TestResult {
    let fence = fence_of(store).await?;
    let t = FencingToken;
    if !fence.shared() {
        let r = fence.admit_shared("rw-doc", t(1), LockMode::Shared).await;
        ensure!(
            matches!(r, Err(Error::Unsupported(_))),
            "admit_shared without shared support: {r:?}"
        );
        return Ok(());
    }
    let (w, r) = (LockMode::Exclusive, LockMode::Shared);
    fence.admit_shared("rw-doc", t(5), w).await?;
    fence.admit_shared("rw-doc", t(7), r).await?;
    fence.admit_shared("rw-doc", t(6), r).await?; // an earlier reader of the same generation
    fence.admit_shared("rw-doc", t(6), r).await?;
    match fence.admit_shared("rw-doc", t(6), w).await {
        Err(Error::Stale { current, .. }) => ensure!(current == t(7), "writer 6 vs {current}"),
        other => return Err(format!("writer 6 after reader 7: {other:?}").into()),
    }
    ensure!(
        fence.highest("rw-doc").await? == Some(t(7))
            && fence.highest_writer("rw-doc").await? == Some(t(5)),
        "after readers: {:?} / {:?}",
        fence.highest("rw-doc").await?,
        fence.highest_writer("rw-doc").await?
    );
    fence.admit("rw-doc", t(8)).await?; // plain admit: a writer
    match fence.admit_shared("rw-doc", t(7), r).await {
        Err(Error::Stale { current, .. }) => ensure!(current == t(8), "reader 7 vs {current}"),
        other => return Err(format!("reader 7 after writer 8: {other:?}").into()),
    }
    fence.admit_shared("rw-doc", t(9), r).await?;
    ensure!(
        fence.admit("rw-doc", t(8)).await.is_err(),
        "a plain admit below a reader's token passed"
    );
    fence.admit_shared("rw-doc", t(9), w).await?;
    ensure!(
        fence.highest_writer("rw-doc").await? == Some(t(9)),
        "the writer was not recorded"
    );
    // A reader first, on a fresh resource: nothing to be below.
    fence.admit_shared("rw-fresh", t(3), r).await?;
    ensure!(
        fence.highest_writer("rw-fresh").await?.is_none()
            && fence.highest("rw-fresh").await? == Some(t(3)),
        "a reader-only resource"
    );
    Ok(())
}

/// Readers survive a restart on persistent backends (or end honestly), and
/// tokens keep growing across it for both modes.
pub async fn restart_keeps_readers_and_tokens(store: &dyn Store) -> TestResult {
    if !shared_or_refused(store).await? {
        return Ok(());
    }
    let (k, o) = (key("rw-restart"), owner("rw-reader"));
    let before = {
        let b = store.connect().await?;
        read_grant(&*b, &k, &o, long_ttl()).await?
    };
    store.restart().await?;
    let b = store.connect().await?;
    let (b, within) = (&*b, super::patient(Duration::from_secs(30)));
    // The reader is still there after the restart: a writer is refused,
    // and the reader's own release works by (owner, token).
    let writer = request(&k, &owner("rw-w"), long_ttl());
    match through_restart(within, || b.try_acquire(&writer)).await? {
        Acquire::Held(_) => {}
        Acquire::Granted(g) => {
            return Err(format!("a writer got {} over a persisted reader", g.token).into())
        }
    }
    let first = reader_lease(&k, &o, before.token);
    through_restart(within, || b.release(&first)).await?;
    let reader = reader_request(&k, &o, long_ttl());
    let again = through_restart(within, || b.try_acquire(&reader)).await?;
    let Acquire::Granted(again) = again else {
        return Err(format!("reader {o} refused on {k} after its release: {again:?}").into());
    };
    ensure!(
        again.token > before.token,
        "{} after {}",
        again.token,
        before.token
    );
    b.release(&reader_lease(&k, &o, again.token)).await?;
    let w = grant(b, &k, &o, long_ttl()).await?;
    ensure!(w.token > again.token, "{} after {}", w.token, again.token);
    Ok(())
}
