//! `SqliteBackend`: the Backend operations as SQLite statements.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock_core::{
    renew_alone, renew_each_mode, Acquire, AcquireAll, AcquireRequest, Backend, Capabilities,
    Error, FencingToken, Grant, LeaseId, LockInfo, LockKey, LockMode, Owner, Renewal, Result,
    WakeHub, WakeSubscription,
};
use rusqlite::{
    named_params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior,
};

use crate::{clock::HostClock, connection::Db, error, options::SqliteOptions};

mod admin;
mod shared;

/// A lease is live iff it was taken during this boot, has not reached its
/// end on the boot-time clock, and was not renewed "in the future" (which
/// only a restarted clock can produce). Every statement that decides on a
/// lease uses this one condition, with `:boot` and `:now` bound.
const LIVE: &str = "(boot_id = :boot AND expires_mono_us > :now AND renewed_mono_us <= :now)";

const COLUMNS: &str =
    "key, owner, token, kind, data, acquired_at_ms, expires_at_ms, acquired_mono_us, expires_mono_us";

/// Where leases of each mode live: writers (and plain locks) one row per
/// key in `fencelock_locks`, readers one row per (key, token) in
/// `fencelock_readers`, with the same columns, so every statement below is
/// written once for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    Locks,
    Readers,
}

impl Table {
    /// Where leases of `mode` live.
    pub(crate) fn of(mode: LockMode) -> Self {
        match mode {
            LockMode::Exclusive => Table::Locks,
            LockMode::Shared => Table::Readers,
        }
    }
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Locks => "fencelock_locks",
            Table::Readers => "fencelock_readers",
        }
    }

    fn mode(self) -> LockMode {
        match self {
            Table::Locks => LockMode::Exclusive,
            Table::Readers => LockMode::Shared,
        }
    }
}

const TABLES: [Table; 2] = [Table::Locks, Table::Readers];

/// A row of `fencelock_locks` or `fencelock_readers`, before validation.
struct RawLease {
    key: String,
    owner: String,
    token: i64,
    kind: Option<String>,
    data: Option<String>,
    acquired_at_ms: i64,
    expires_at_ms: i64,
    acquired_mono_us: i64,
    expires_mono_us: i64,
    mode: LockMode,
}

impl RawLease {
    fn from_row(row: &Row<'_>, table: Table) -> rusqlite::Result<Self> {
        Ok(Self {
            key: row.get(0)?,
            owner: row.get(1)?,
            token: row.get(2)?,
            kind: row.get(3)?,
            data: row.get(4)?,
            acquired_at_ms: row.get(5)?,
            expires_at_ms: row.get(6)?,
            acquired_mono_us: row.get(7)?,
            expires_mono_us: row.get(8)?,
            mode: table.mode(),
        })
    }

    fn held_for(&self, now_us: i64) -> Duration {
        micros(now_us - self.acquired_mono_us)
    }

    fn into_info(self, now_us: i64) -> Result<LockInfo> {
        let corrupt =
            |what: &str, e: &dyn std::fmt::Display| error::corrupt(format!("{what}: {e}"));
        Ok(LockInfo {
            expires_in: micros(self.expires_mono_us - now_us),
            mode: self.mode,
            key: LockKey::new(self.key).map_err(|e| corrupt("key", &e))?,
            owner: Owner::new(self.owner).map_err(|e| corrupt("owner", &e))?,
            token: FencingToken(u64::try_from(self.token).map_err(|e| corrupt("token", &e))?),
            kind: self.kind,
            data: self
                .data
                .map(|d| serde_json::from_str(&d))
                .transpose()
                .map_err(|e| corrupt("data", &e))?,
            acquired_at: wall(self.acquired_at_ms),
            expires_at: wall(self.expires_at_ms),
        })
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn wall(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::UNIX_EPOCH)
}

/// Wall-clock milliseconds, stored for display only; no lease decision reads
/// them (I4).
fn wall_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ttl_us(ttl: Duration) -> i64 {
    // validate_ttl caps TTLs at a week, far inside i64 microseconds.
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Waiters of every backend in this process that opened the same file share
/// one hub, so a release by one client wakes the waiters of another at once.
fn hub_for(path: &Path) -> WakeHub {
    static HUBS: OnceLock<Mutex<HashMap<PathBuf, WakeHub>>> = OnceLock::new();
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    HUBS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(canonical)
        .or_default()
        .clone()
}

/// Locks in a SQLite file. Each value holds one connection; clones share it.
#[derive(Clone, Debug)]
pub struct SqliteBackend {
    db: Db,
    clock: HostClock,
    wakeups: WakeHub,
}

impl SqliteBackend {
    /// Opens (and if needed creates) the lock database of a `sqlite://PATH`
    /// URL (see [`SqliteOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(SqliteOptions::from_url(url)?).await
    }

    /// Opens (and if needed creates) the lock database `options` name.
    pub async fn connect_with(options: SqliteOptions) -> Result<Self> {
        let clock = HostClock::new()?;
        let db = Db::open(&options).await?;
        Ok(Self {
            db,
            clock,
            wakeups: hub_for(options.path()),
        })
    }

    /// Runs `f` in an IMMEDIATE transaction with the clock read *after* the
    /// write lock was taken, so the time a decision uses is the time it is
    /// made, however long the busy wait was.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>, Now) -> Result<T> + Send + 'static,
    {
        let clock = self.clock.clone();
        self.db.call(move |conn| write_tx(conn, &clock, f)).await
    }

    /// Runs `f` in a read transaction whose snapshot is fixed *before* the
    /// clock is read. In the other order, a renewal committed between the
    /// clock read and the snapshot would carry `renewed_mono_us > now` and
    /// look like a lease from a restarted clock, i.e. expired: `inspect`
    /// would call a held lock free.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Now) -> Result<T> + Send + 'static,
    {
        let clock = self.clock.clone();
        self.db
            .call(move |conn| {
                let tx = conn.transaction().map_err(error::map)?;
                tx.query_row("SELECT last_token FROM fencelock_counter", [], |_| Ok(()))
                    .map_err(error::map)?;
                let now = Now::read(&clock)?;
                f(&tx, now)
            })
            .await
    }

    /// Renews a batch of leases of one table in one IMMEDIATE transaction:
    /// one write lock and one clock reading decide every lease of it.
    async fn renew_batch(&self, table: Table, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let batch = renewals.to_vec();
        let renewed = self
            .write(move |tx, now| {
                batch
                    .iter()
                    .map(|r| renew_in(tx, now, table, &r.lease, r.ttl))
                    .collect::<Result<Vec<_>>>()
            })
            .await?;
        Ok(renewals
            .iter()
            .zip(renewed)
            .map(|(r, expires_ms)| match expires_ms {
                Some(ms) => Ok(Grant::new(r.lease.token, r.ttl, wall(ms))),
                None => Err(Error::not_held(&r.lease)),
            })
            .collect())
    }

    /// Releases `lease` from `table` (I3) and wakes the key's waiters.
    async fn release_from(&self, table: Table, lease: &LeaseId) -> Result<()> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let Ok(db_token) = i64::try_from(token.0) else {
            return Err(Error::not_held(lease));
        };
        let (k, o) = (key.clone(), owner.clone());
        let released = self
            .write(move |tx, now| release_in(tx, now, table, k.as_str(), o.as_str(), db_token))
            .await?;
        if released {
            self.wakeups.notify(key.as_str());
        }
        lease.found(released)
    }
}

/// Runs `f` in an IMMEDIATE transaction on `conn` with the clock read after
/// the write lock was taken (see [`SqliteBackend::write`]).
pub(crate) fn write_tx<T>(
    conn: &mut Connection,
    clock: &HostClock,
    f: impl FnOnce(&Transaction<'_>, Now) -> Result<T>,
) -> Result<T> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(error::map)?;
    let now = Now::read(clock)?;
    let value = f(&tx, now)?;
    tx.commit().map_err(error::map)?;
    Ok(value)
}

/// The body of an acquisition, inside [`write_tx`].
pub(crate) fn acquire_in(
    tx: &Transaction<'_>,
    now: Now,
    request: &AcquireRequest,
) -> Result<Acquire> {
    if let Some(holder) = writer_blocked_by(tx, now, request)? {
        return Ok(Acquire::Held(Some(holder)));
    }
    grant_in(tx, now, request).map(Acquire::Granted)
}

/// The body of an atomic multi-key acquisition, inside [`write_tx`]: the
/// write lock is held, so the keys checked first are still free when the
/// grants are written, and an error in between rolls every grant back.
fn acquire_all_in(
    tx: &Transaction<'_>,
    now: Now,
    requests: &[AcquireRequest],
) -> Result<AcquireAll> {
    for (index, request) in requests.iter().enumerate() {
        if let Some(holder) = writer_blocked_by(tx, now, request)? {
            return Ok(AcquireAll::Held {
                index,
                holder: Some(holder),
            });
        }
    }
    requests
        .iter()
        .map(|request| grant_in(tx, now, request))
        .collect::<Result<Vec<_>>>()
        .map(AcquireAll::Granted)
}

/// Who keeps a writer from the key: its live holder, else its last live
/// reader (docs/rwlock.md).
fn writer_blocked_by(
    tx: &Transaction<'_>,
    now: Now,
    request: &AcquireRequest,
) -> Result<Option<LockInfo>> {
    if let Some(holder) = live_lease(tx, request.key.as_str(), now)? {
        return holder.into_info(now.us).map(Some);
    }
    last_reader(tx, request.key.as_str(), now)?
        .map(|reader| reader.into_info(now.us))
        .transpose()
}

/// Writes the writer's lease on a key found free, withdrawing its intent.
fn grant_in(tx: &Transaction<'_>, now: Now, request: &AcquireRequest) -> Result<Grant> {
    let token = next_token(tx, request)?;
    tx.execute(
        "DELETE FROM fencelock_intents WHERE key = :key AND owner = :owner",
        named_params! {":key": request.key.as_str(), ":owner": request.owner.as_str()},
    )
    .map_err(error::map)?;
    insert_lease(tx, now, Table::Locks, request, token)
}

/// The body of a reader's acquisition, inside [`write_tx`]: granted while
/// no writer holds the key and no writer's intent is live.
fn acquire_shared_in(tx: &Transaction<'_>, now: Now, request: &AcquireRequest) -> Result<Acquire> {
    if let Some(holder) = live_lease(tx, request.key.as_str(), now)? {
        return Ok(Acquire::Held(Some(holder.into_info(now.us)?)));
    }
    let intent: Option<i64> = tx
        .query_row(
            &format!("SELECT 1 FROM fencelock_intents WHERE key = :key AND {LIVE}"),
            named_params! {":key": request.key.as_str(), ":boot": now.boot, ":now": now.us},
            |r| r.get(0),
        )
        .optional()
        .map_err(error::map)?;
    if intent.is_some() {
        return Ok(Acquire::Held(None));
    }
    let token = next_token(tx, request)?;
    insert_lease(tx, now, Table::Readers, request, token).map(Acquire::Granted)
}

/// Draws the next token of the one counter.
fn next_token(tx: &Transaction<'_>, request: &AcquireRequest) -> Result<i64> {
    // One counter for every key, raised to the floor first: the token is
    // above the floor and above every token issued before (I2). A counter
    // at the end of the token space is left where it is (no row updated),
    // so it never passes the limit and never turns into a REAL.
    let floor = i64::try_from(request.floor()?).unwrap_or(i64::MAX);
    let max = i64::try_from(FencingToken::MAX.get()).unwrap_or(i64::MAX);
    let token: Option<i64> = tx
        .query_row(
            "UPDATE fencelock_counter SET last_token = max(last_token, :floor) + 1 \
             WHERE id = 1 AND max(last_token, :floor) < :max RETURNING last_token",
            named_params! {":floor": floor, ":max": max},
            |r| r.get(0),
        )
        .optional()
        .map_err(error::map)?;
    token.ok_or_else(|| Error::TokensExhausted {
        key: request.key.clone(),
    })
}

/// Stores the lease `request` was granted with `token` in `table`.
fn insert_lease(
    tx: &Transaction<'_>,
    now: Now,
    table: Table,
    request: &AcquireRequest,
    token: i64,
) -> Result<Grant> {
    let wall_now = wall_now_ms();
    let data = request.data.as_ref().map(|d| d.to_string());
    // A reader's row is new (its token is); a writer's replaces the key's
    // expired one.
    let conflict = match table {
        Table::Locks => "(key)",
        Table::Readers => "(key, token)",
    };
    tx.execute(
        &format!(
            "INSERT INTO {} (key, owner, token, kind, data, acquired_at_ms, \
             expires_at_ms, boot_id, acquired_mono_us, renewed_mono_us, expires_mono_us) \
         VALUES (:key, :owner, :token, :kind, :data, :wall, :wall_exp, :boot, :now, :now, \
             :now + :ttl) \
         ON CONFLICT {conflict} DO UPDATE SET owner = excluded.owner, token = excluded.token, \
             kind = excluded.kind, data = excluded.data, \
             acquired_at_ms = excluded.acquired_at_ms, expires_at_ms = excluded.expires_at_ms, \
             boot_id = excluded.boot_id, acquired_mono_us = excluded.acquired_mono_us, \
             renewed_mono_us = excluded.renewed_mono_us, \
             expires_mono_us = excluded.expires_mono_us",
            table.name()
        ),
        named_params! {
            ":key": request.key.as_str(), ":owner": request.owner.as_str(), ":token": token,
            ":kind": request.kind, ":data": data, ":wall": wall_now,
            ":wall_exp": wall_now + ttl_ms(request.ttl), ":boot": now.boot, ":now": now.us,
            ":ttl": ttl_us(request.ttl),
        },
    )
    .map_err(error::map)?;
    Ok(Grant::new(
        FencingToken(u64::try_from(token).map_err(|e| error::corrupt(format!("counter: {e}")))?),
        request.ttl,
        wall(wall_now + ttl_ms(request.ttl)),
    ))
}

/// The body of a release, inside [`write_tx`]: whether the lease was removed.
pub(crate) fn release_in(
    tx: &Transaction<'_>,
    now: Now,
    table: Table,
    key: &str,
    owner: &str,
    token: i64,
) -> Result<bool> {
    let n = tx
        .execute(
            &format!(
                "DELETE FROM {} \
                 WHERE key = :key AND owner = :owner AND token = :token AND {LIVE}",
                table.name()
            ),
            named_params! {
                ":key": key, ":owner": owner, ":token": token,
                ":boot": now.boot, ":now": now.us,
            },
        )
        .map_err(error::map)?;
    Ok(n == 1)
}

/// The body of a renewal, inside [`write_tx`]: the new display expiry
/// (wall-clock milliseconds) if `lease` was current and unexpired (I3).
fn renew_in(
    tx: &Transaction<'_>,
    now: Now,
    table: Table,
    lease: &LeaseId,
    ttl: Duration,
) -> Result<Option<i64>> {
    // Tokens are stored as i64: a larger one was never issued.
    let Ok(token) = i64::try_from(lease.token.get()) else {
        return Ok(None);
    };
    let expires_ms = wall_now_ms() + ttl_ms(ttl);
    let changed = tx
        .prepare_cached(&format!(
            "UPDATE {} SET renewed_mono_us = :now, \
             expires_mono_us = :now + :ttl, expires_at_ms = :wall_exp \
             WHERE key = :key AND owner = :owner AND token = :token AND {LIVE}",
            table.name()
        ))
        .and_then(|mut stmt| {
            stmt.execute(named_params! {
                ":now": now.us, ":ttl": ttl_us(ttl), ":wall_exp": expires_ms,
                ":key": lease.key.as_str(), ":owner": lease.owner.as_str(), ":token": token,
                ":boot": now.boot,
            })
        })
        .map_err(error::map)?;
    Ok((changed == 1).then_some(expires_ms))
}

/// The backend clock at one instant.
#[derive(Clone, Copy)]
pub(crate) struct Now {
    boot: &'static str,
    us: i64,
}

impl Now {
    pub(crate) fn read(clock: &HostClock) -> Result<Self> {
        Ok(Self {
            boot: clock.boot_id(),
            us: clock.now_us().map_err(error::clock)?,
        })
    }
}

fn live_lease(conn: &Connection, key: &str, now: Now) -> Result<Option<RawLease>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM fencelock_locks WHERE key = :key AND {LIVE}"),
        named_params! {":key": key, ":boot": now.boot, ":now": now.us},
        |r| RawLease::from_row(r, Table::Locks),
    )
    .optional()
    .map_err(error::map)
}

/// The live reader of `key` whose lease ends last.
fn last_reader(conn: &Connection, key: &str, now: Now) -> Result<Option<RawLease>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM fencelock_readers WHERE key = :key AND {LIVE} \
         ORDER BY expires_mono_us DESC LIMIT 1"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(
            named_params! {":key": key, ":boot": now.boot, ":now": now.us},
            |r| RawLease::from_row(r, Table::Readers),
        )
        .optional()
    })
    .map_err(error::map)
}

/// Live leases of both modes whose key starts with `prefix` (literally:
/// substr(), no LIKE wildcards), by key then token.
fn live_leases(conn: &Connection, now: Now, prefix: &str) -> Result<Vec<RawLease>> {
    let mut leases = Vec::new();
    for table in TABLES {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM {} \
                 WHERE substr(key, 1, length(:prefix)) = :prefix AND {LIVE}",
                table.name()
            ))
            .map_err(error::map)?;
        let rows = stmt
            .query_map(
                named_params! {":prefix": prefix, ":boot": now.boot, ":now": now.us},
                |r| RawLease::from_row(r, table),
            )
            .map_err(error::map)?;
        for row in rows {
            leases.push(row.map_err(error::map)?);
        }
    }
    leases.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
    Ok(leases)
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_wakeups(true)
            .with_persistent(true)
            .with_keeps_expired(true)
            .with_min_token(true)
            .with_batch_renew(true)
            .with_set_data(true)
            .with_shared(true)
            .with_atomic_multi(true)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let request = request.clone();
        self.write(move |tx, now| match request.mode {
            LockMode::Exclusive => acquire_in(tx, now, &request),
            LockMode::Shared => acquire_shared_in(tx, now, &request),
        })
        .await
    }

    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let requests = requests.to_vec();
        self.write(move |tx, now| acquire_all_in(tx, now, &requests))
            .await
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        renew_alone(lease, ttl, |one| async move { self.renew_many(&one).await }).await
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        renew_each_mode(error::NAME, renewals, |mode, batch| async move {
            self.renew_batch(Table::of(mode), &batch).await
        })
        .await
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        // Tokens are stored as i64: a larger one was never issued.
        let Ok(token) = i64::try_from(lease.token.get()) else {
            return Err(Error::not_held(lease));
        };
        let (key, owner) = (lease.key.clone(), lease.owner.clone());
        let data = data.map(|d| d.to_string());
        let changed = self
            .write(move |tx, now| {
                tx.execute(
                    &format!(
                        "UPDATE fencelock_locks SET data = :data \
                         WHERE key = :key AND owner = :owner AND token = :token AND {LIVE}"
                    ),
                    named_params! {
                        ":data": data, ":key": key.as_str(), ":owner": owner.as_str(),
                        ":token": token, ":boot": now.boot, ":now": now.us,
                    },
                )
                .map_err(error::map)
            })
            .await?;
        lease.found(changed == 1)
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        self.release_from(Table::of(lease.mode), lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let k = key.clone();
        self.read(move |conn, now| {
            let current = match live_lease(conn, k.as_str(), now)? {
                Some(writer) => Some(writer),
                None => last_reader(conn, k.as_str(), now)?,
            };
            current.map(|l| l.into_info(now.us)).transpose()
        })
        .await
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        Ok(Some(self.wakeups.subscribe(key.as_str())))
    }

    fencelock_core::offers!(admin, write_intents);
}
