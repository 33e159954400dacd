//! The fenced store and the history it records.
//!
//! The store is a SQLite file on a disk the nemesis never touches. It holds
//! the counters the workers increment (one per fenced resource: the lock's
//! counter, a semaphore slot's, a key's of a multi-key lock), the fence that
//! guards them (this project's own [`SqliteFence`], used inside the store's
//! transactions, in the mode of the lease for read-write locks) and an
//! append-only table of events. Every admitted write is appended in the same
//! transaction that changes its counter, so the history of admitted writes
//! is exactly the list of writes that took effect, in commit order.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fencelock::{Error, FencingToken, LockMode};
use fencelock_sqlite::SqliteFence;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The fenced resource of the workloads with one counter (lock, rwlock,
/// election).
pub const RESOURCE: &str = "torture-counter";

const SCHEMA: &str = "
-- One counter per fenced resource, created by its first admitted write; a
-- resource without a row reads 0.
CREATE TABLE torture_counters (
    resource TEXT PRIMARY KEY,
    value    INTEGER NOT NULL
);
-- seq is the commit order: every writer takes the database's write lock
-- (BEGIN IMMEDIATE) before it appends.
CREATE TABLE torture_events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL,
    worker        INTEGER,
    token         INTEGER,
    resource      TEXT,
    mode          TEXT,
    outcome       TEXT,
    t_start_us    INTEGER,
    t_us          INTEGER NOT NULL,
    value_read    INTEGER,
    value_written INTEGER,
    detail        TEXT
);
";

/// Microseconds on `CLOCK_MONOTONIC`, which on Linux is one clock for the
/// whole system: times taken by different worker processes compare.
pub fn now_us() -> i64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    t.tv_sec() * 1_000_000 + t.tv_nsec() / 1_000
}

/// What a row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A lock grant: `t_start` = acquire requested, `t` = granted.
    Grant,
    /// The token offered to the fence before reading (fenced runs).
    Admit,
    /// The counter was read (`value_read`).
    Read,
    /// A write attempt: `outcome` admitted or refused, `t_start` = attempt
    /// began, `t` = committed.
    Write,
    /// `t_start` = release called, `t` = answered; outcome ok, not-held or
    /// error.
    Release,
    /// The guard's loss signal fired at `t`; `detail` = why.
    Lost,
    /// The grant's trusted interval ended at `t`: the first of release
    /// called, loss noticed and the guard's own deadline (I5), which a
    /// holder paused past it reaches while stopped.
    Trusted,
    /// An operation failed (`detail`).
    Error,
    /// The nemesis injected a fault (`detail` = its kind) on `worker` (none
    /// for the server), from `t_start` to `t`.
    Fault,
    /// A `sharded://` worker opened its backend on the shard map whose
    /// epoch is `detail`, holding nothing from the map before.
    Map,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Grant => "grant",
            Kind::Admit => "admit",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Release => "release",
            Kind::Lost => "lost",
            Kind::Trusted => "trusted",
            Kind::Error => "error",
            Kind::Fault => "fault",
            Kind::Map => "map",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "grant" => Kind::Grant,
            "admit" => Kind::Admit,
            "read" => Kind::Read,
            "write" => Kind::Write,
            "release" => Kind::Release,
            "lost" => Kind::Lost,
            "trusted" => Kind::Trusted,
            "error" => Kind::Error,
            "fault" => Kind::Fault,
            "map" => Kind::Map,
            _ => return None,
        })
    }
}

/// Outcomes of admits and writes.
pub const ADMITTED: &str = "admitted";
/// A fence refused the token.
pub const REFUSED: &str = "refused";
/// The `mode` column of a reader's rows.
const SHARED: &str = "shared";

/// One row of the history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    /// Commit order.
    pub seq: i64,
    /// What happened.
    #[serde(serialize_with = "kind_name")]
    pub kind: Kind,
    /// The worker, if any.
    pub worker: Option<u32>,
    /// The fencing token involved.
    pub token: Option<u64>,
    /// The fenced resource (the counter) involved.
    pub resource: Option<String>,
    /// Whether the lease is a read-write lock's reader's (admitted with
    /// [`LockMode::Shared`]; a reader's write changes no counter).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// `admitted`, `refused`, `ok`, `not-held`, `error`.
    pub outcome: Option<String>,
    /// When the operation began (µs, `CLOCK_MONOTONIC`).
    pub t_start_us: Option<i64>,
    /// When it ended.
    pub t_us: i64,
    /// The counter value read.
    pub value_read: Option<i64>,
    /// The counter value written (or attempted).
    pub value_written: Option<i64>,
    /// Free text: an error, a loss reason, a fault kind.
    pub detail: Option<String>,
}

fn kind_name<S: serde::Serializer>(kind: &Kind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.as_str())
}

impl Event {
    /// A row about to be appended (its `seq` is assigned by the store).
    pub fn new(kind: Kind, worker: Option<u32>, token: Option<FencingToken>, t_us: i64) -> Self {
        Self {
            seq: 0,
            kind,
            worker,
            token: token.map(|t| t.0),
            resource: None,
            shared: false,
            outcome: None,
            t_start_us: None,
            t_us,
            value_read: None,
            value_written: None,
            detail: None,
        }
    }

    /// Sets the resource.
    pub fn on(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_owned());
        self
    }

    /// Marks a reader's lease (or sets the flag `shared`).
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Sets the outcome.
    pub fn outcome(mut self, outcome: &str) -> Self {
        self.outcome = Some(outcome.to_owned());
        self
    }

    /// Sets the start time.
    pub fn started(mut self, t_start_us: i64) -> Self {
        self.t_start_us = Some(t_start_us);
        self
    }

    /// Sets the detail.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Whether this is an admit or write the fence (or, unfenced, the store)
    /// accepted.
    pub fn admitted(&self) -> bool {
        self.outcome.as_deref() == Some(ADMITTED)
    }
}

/// One fenced resource a grant covers, with the token that guards it there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The resource (and its counter).
    pub resource: String,
    /// The lease's token.
    pub token: FencingToken,
    /// A read-write lock's reader: admitted with [`LockMode::Shared`].
    pub shared: bool,
}

impl Part {
    /// An exclusive lease's part.
    pub fn exclusive(resource: impl Into<String>, token: FencingToken) -> Self {
        Self {
            resource: resource.into(),
            token,
            shared: false,
        }
    }

    /// A row about this part.
    pub fn event(&self, kind: Kind, worker: u32, t_us: i64) -> Event {
        Event::new(kind, Some(worker), Some(self.token), t_us)
            .on(&self.resource)
            .shared(self.shared)
    }

    fn mode(&self) -> LockMode {
        if self.shared {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        }
    }
}

/// What the store said to a write attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The counter now holds the value written.
    Admitted,
    /// The fence refused the token; nothing changed.
    Refused,
}

/// A connection to the store.
pub struct Store {
    conn: Connection,
    fenced: bool,
}

/// A failure of the store itself: the run cannot be judged.
pub fn store_error(message: impl Into<String>) -> Error {
    fencelock::BackendError::message("torture store", fencelock::ErrorStatus::Permanent, message)
        .into()
}

fn sql(e: rusqlite::Error) -> Error {
    store_error(e.to_string())
}

fn token_sql(token: Option<u64>) -> Result<Option<i64>, Error> {
    token
        .map(|t| {
            i64::try_from(t)
                .map_err(|_| store_error(format!("token {t} does not fit the torture store")))
        })
        .transpose()
}

impl Store {
    /// Creates a fresh store at `path`, which must not exist.
    pub fn create(path: &Path) -> Result<(), Error> {
        if path.exists() {
            return Err(Error::InvalidArgument(format!(
                "--store {} exists; the store must be a new file",
                path.display()
            )));
        }
        let conn = open(path, Duration::from_secs(5))?;
        fencelock_sqlite::ensure_schema(&conn)?;
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))
            .map_err(sql)
    }

    /// Opens the store. `busy` bounds how long a statement waits for
    /// another process's transaction: it must outlast the longest pause of
    /// a worker caught inside one.
    pub fn open(path: &Path, busy: Duration, fenced: bool) -> Result<Self, Error> {
        Ok(Self {
            conn: open(path, busy)?,
            fenced,
        })
    }

    /// After a grant of the fenced `parts` (one, or one per key of a
    /// multi-key lock): records the grant and, fenced, admits each part's
    /// token in its lease's mode before reading that part's counter, all in
    /// one transaction. Per part, `None` when the fence refused the token (a
    /// newer holder has been admitted), else the counter read.
    pub fn begin(
        &mut self,
        worker: u32,
        requested: i64,
        granted: i64,
        parts: &[Part],
    ) -> Result<Vec<Option<i64>>, Error> {
        let fenced = self.fenced;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        for part in parts {
            append(
                &tx,
                &part.event(Kind::Grant, worker, granted).started(requested),
            )?;
        }
        let mut reads = Vec::with_capacity(parts.len());
        for part in parts {
            if fenced {
                let admitted = admit(&tx, part)?;
                let outcome = if admitted { ADMITTED } else { REFUSED };
                append(
                    &tx,
                    &part.event(Kind::Admit, worker, now_us()).outcome(outcome),
                )?;
                if !admitted {
                    reads.push(None);
                    continue;
                }
            }
            let value = counter(&tx, &part.resource)?;
            let mut read = part.event(Kind::Read, worker, now_us());
            read.value_read = Some(value);
            append(&tx, &read)?;
            reads.push(Some(value));
        }
        tx.commit().map_err(sql)?;
        Ok(reads)
    }

    /// Writes each part's `read + 1` carrying its token (fenced: only if
    /// the fence still admits it), and records each attempt in the same
    /// transaction. A reader's write changes nothing: admitted, it records
    /// that the reader still held its read when it acted on it.
    pub fn write(
        &mut self,
        worker: u32,
        parts: &[(Part, i64)],
    ) -> Result<Vec<WriteOutcome>, Error> {
        let started = now_us();
        let fenced = self.fenced;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        let mut outcomes = Vec::with_capacity(parts.len());
        for (part, read) in parts {
            let outcome = if !fenced || admit(&tx, part)? {
                if !part.shared {
                    tx.execute(
                        "INSERT INTO torture_counters (resource, value) VALUES (?1, ?2) \
                         ON CONFLICT (resource) DO UPDATE SET value = excluded.value",
                        params![part.resource, read + 1],
                    )
                    .map_err(sql)?;
                }
                WriteOutcome::Admitted
            } else {
                WriteOutcome::Refused
            };
            let mut event = part
                .event(Kind::Write, worker, now_us())
                .started(started)
                .outcome(match outcome {
                    WriteOutcome::Admitted => ADMITTED,
                    WriteOutcome::Refused => REFUSED,
                });
            event.value_read = Some(*read);
            event.value_written = (!part.shared).then_some(read + 1);
            append(&tx, &event)?;
            outcomes.push(outcome);
        }
        tx.commit().map_err(sql)?;
        Ok(outcomes)
    }

    /// Appends rows in one transaction.
    pub fn record(&mut self, events: &[Event]) -> Result<(), Error> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        for event in events {
            append(&tx, event)?;
        }
        tx.commit().map_err(sql)
    }

    /// Number of admitted writes so far: progress.
    pub fn admitted_writes(&self) -> Result<u64, Error> {
        self.conn
            .query_row(
                "SELECT count(*) FROM torture_events WHERE kind = 'write' AND outcome = ?1",
                [ADMITTED],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.unsigned_abs())
            .map_err(sql)
    }

    /// The newest shard-map epoch each worker has opened its backend on
    /// (see [`Kind::Map`]), by worker.
    pub fn map_epochs(&self) -> Result<BTreeMap<u32, u64>, Error> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT worker, max(CAST(detail AS INTEGER)) FROM torture_events \
                 WHERE kind = 'map' GROUP BY worker",
            )
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)?)))
            .map_err(sql)?;
        let mut epochs = BTreeMap::new();
        for row in rows {
            let (worker, epoch) = row.map_err(sql)?;
            epochs.insert(worker, epoch.unsigned_abs());
        }
        Ok(epochs)
    }

    /// The workers whose latest event is a read: they hold what they
    /// believe is the lock and are working towards their write.
    pub fn workers_between_read_and_write(&self) -> Result<Vec<u32>, Error> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT worker, kind FROM torture_events WHERE seq IN \
                 (SELECT max(seq) FROM torture_events WHERE worker IS NOT NULL \
                  AND kind != 'fault' GROUP BY worker)",
            )
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql)?;
        let mut workers = Vec::new();
        for row in rows {
            let (worker, kind) = row.map_err(sql)?;
            if kind == Kind::Read.as_str() {
                workers.push(worker);
            }
        }
        Ok(workers)
    }

    /// Every counter that was written, by resource.
    pub fn counters(&self) -> Result<BTreeMap<String, i64>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT resource, value FROM torture_counters")
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(sql)?;
        rows.collect::<Result<_, _>>().map_err(sql)
    }

    /// Every event, in commit order.
    pub fn events(&self) -> Result<Vec<Event>, Error> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, kind, worker, token, outcome, t_start_us, t_us, value_read, \
                 value_written, detail, resource, mode FROM torture_events ORDER BY seq",
            )
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| {
                let kind: String = r.get(1)?;
                Ok((
                    kind,
                    Event {
                        seq: r.get(0)?,
                        kind: Kind::Error,
                        worker: r.get(2)?,
                        token: r.get::<_, Option<i64>>(3)?.map(i64::unsigned_abs),
                        resource: r.get(10)?,
                        shared: r.get::<_, Option<String>>(11)?.as_deref() == Some(SHARED),
                        outcome: r.get(4)?,
                        t_start_us: r.get(5)?,
                        t_us: r.get(6)?,
                        value_read: r.get(7)?,
                        value_written: r.get(8)?,
                        detail: r.get(9)?,
                    },
                ))
            })
            .map_err(sql)?;
        let mut events = Vec::new();
        for row in rows {
            let (kind, mut event) = row.map_err(sql)?;
            event.kind = Kind::parse(&kind)
                .ok_or_else(|| store_error(format!("unknown event kind {kind:?}")))?;
            events.push(event);
        }
        Ok(events)
    }
}

/// A store used from async code: each call runs on a blocking thread.
#[derive(Clone)]
pub struct SharedStore(Arc<Mutex<Store>>);

impl SharedStore {
    /// Wraps `store`.
    pub fn new(store: Store) -> Self {
        Self(Arc::new(Mutex::new(store)))
    }

    /// Runs `f` with the store on a blocking thread.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let store = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            f(&mut store.lock().unwrap_or_else(PoisonError::into_inner))
        })
        .await
        .map_err(|e| store_error(format!("store task failed: {e}")))?
    }

    /// Appends rows in one transaction.
    pub async fn record(&self, events: Vec<Event>) -> Result<(), Error> {
        self.call(move |s| s.record(&events)).await
    }
}

fn open(path: &Path, busy: Duration) -> Result<Connection, Error> {
    let conn = Connection::open(path)
        .map_err(|e| store_error(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(busy).map_err(sql)?;
    // WAL: the nemesis reads progress without blocking the workers.
    // NORMAL: the store only has to survive the crash of a worker process,
    // not of the machine.
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .map_err(sql)?;
    conn.execute_batch("PRAGMA synchronous = NORMAL")
        .map_err(sql)?;
    Ok(conn)
}

/// The fence, inside the caller's transaction: whether the part's token is
/// admitted in its lease's mode.
fn admit(conn: &Connection, part: &Part) -> Result<bool, Error> {
    match SqliteFence::admit_shared_in(conn, &part.resource, part.token, part.mode()) {
        Ok(()) => Ok(true),
        Err(Error::Stale { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn counter(conn: &Connection, resource: &str) -> Result<i64, Error> {
    Ok(conn
        .query_row(
            "SELECT value FROM torture_counters WHERE resource = ?1",
            [resource],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql)?
        .unwrap_or(0))
}

fn append(conn: &Connection, e: &Event) -> Result<(), Error> {
    conn.execute(
        "INSERT INTO torture_events (kind, worker, token, outcome, t_start_us, t_us, \
         value_read, value_written, detail, resource, mode) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            e.kind.as_str(),
            e.worker,
            token_sql(e.token)?,
            e.outcome,
            e.t_start_us,
            e.t_us,
            e.value_read,
            e.value_written,
            e.detail,
            e.resource,
            e.shared.then_some(SHARED),
        ],
    )
    .map_err(sql)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn part(token: u64) -> Part {
        Part::exclusive(RESOURCE, FencingToken(token))
    }

    fn begin(store: &mut Store, worker: u32, token: u64) -> Option<i64> {
        store
            .begin(worker, now_us(), now_us(), &[part(token)])
            .unwrap()[0]
    }

    fn write(store: &mut Store, worker: u32, token: u64, read: i64) -> WriteOutcome {
        store.write(worker, &[(part(token), read)]).unwrap()[0]
    }

    fn fresh(fenced: bool) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path).unwrap();
        let store = Store::open(&path, Duration::from_secs(5), fenced).unwrap();
        (dir, store)
    }

    /// The admit-before-read protocol in the store itself: once a newer
    /// token has been admitted, the older holder's write is refused and the
    /// counter keeps the newer holder's value.
    #[test]
    fn a_stale_holder_cannot_write_after_a_newer_holder_read() {
        let (_dir, mut store) = fresh(true);
        assert_eq!(begin(&mut store, 0, 10), Some(0));
        assert_eq!(begin(&mut store, 1, 11), Some(0));
        assert_eq!(write(&mut store, 0, 10, 0), WriteOutcome::Refused);
        assert_eq!(write(&mut store, 1, 11, 0), WriteOutcome::Admitted);
        assert_eq!(begin(&mut store, 0, 10), None);
        assert_eq!(store.counters().unwrap()[RESOURCE], 1);
        assert_eq!(store.admitted_writes().unwrap(), 1);
        let events = store.events().unwrap();
        let kinds: Vec<Kind> = events.iter().map(|e| e.kind).collect();
        use Kind::*;
        assert_eq!(
            kinds,
            [Grant, Admit, Read, Grant, Admit, Read, Write, Write, Grant, Admit]
        );
        assert!(events
            .iter()
            .all(|e| e.resource.as_deref() == Some(RESOURCE) && !e.shared));
    }

    /// Unfenced, the same interleaving loses an update: the proof that the
    /// fence is what prevents it.
    #[test]
    fn unfenced_the_same_interleaving_loses_an_update() {
        let (_dir, mut store) = fresh(false);
        let a = begin(&mut store, 0, 10).unwrap();
        let b = begin(&mut store, 1, 11).unwrap();
        assert_eq!(write(&mut store, 1, 11, b), WriteOutcome::Admitted);
        assert_eq!(write(&mut store, 0, 10, a), WriteOutcome::Admitted);
        assert_eq!(store.counters().unwrap()[RESOURCE], 1);
        assert_eq!(store.admitted_writes().unwrap(), 2);
    }

    /// A read-write lock's fence: readers of one generation coexist, a
    /// writer above them makes their writes stale, a reader's write changes
    /// no counter; parts on other resources are fenced apart.
    #[test]
    fn readers_and_writers_are_fenced_by_mode_and_resource() {
        let (_dir, mut store) = fresh(true);
        let reader = |token| Part {
            shared: true,
            ..part(token)
        };
        let r = store
            .begin(0, now_us(), now_us(), &[reader(5), reader(4)])
            .unwrap();
        assert_eq!(r, [Some(0), Some(0)]);
        assert_eq!(begin(&mut store, 1, 6), Some(0));
        let w = store.write(0, &[(reader(5), 0)]).unwrap();
        assert_eq!(w, [WriteOutcome::Refused]);
        assert_eq!(write(&mut store, 1, 6, 0), WriteOutcome::Admitted);
        let r = store.begin(2, now_us(), now_us(), &[reader(7)]).unwrap();
        assert_eq!(r, [Some(1)]);
        assert_eq!(
            store.write(2, &[(reader(7), 1)]).unwrap(),
            [WriteOutcome::Admitted]
        );
        let other = Part::exclusive("torture-key-1", FencingToken(1));
        assert_eq!(
            store
                .begin(3, now_us(), now_us(), std::slice::from_ref(&other))
                .unwrap(),
            [Some(0)]
        );
        assert_eq!(
            store.write(3, &[(other, 0)]).unwrap(),
            [WriteOutcome::Admitted]
        );
        let counters = store.counters().unwrap();
        assert_eq!(counters.len(), 2);
        assert_eq!((counters[RESOURCE], counters["torture-key-1"]), (1, 1));
        assert!(store.events().unwrap().iter().any(|e| e.shared));
    }

    #[test]
    fn workers_between_read_and_write() {
        let (_dir, mut store) = fresh(true);
        begin(&mut store, 0, 10);
        begin(&mut store, 1, 11);
        write(&mut store, 1, 11, 0);
        store
            .record(&[Event::new(Kind::Fault, Some(0), None, now_us()).detail("pause")])
            .unwrap();
        assert_eq!(store.workers_between_read_and_write().unwrap(), [0]);
    }

    #[test]
    fn an_existing_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path).unwrap();
        assert!(Store::create(&path).is_err());
    }
}
