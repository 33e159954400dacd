//! The fenced store and the history it records.
//!
//! The store is a SQLite file on a disk the nemesis never touches. It holds
//! the counter the workers increment, the fence that guards it (this
//! project's own [`SqliteFence`], used inside the store's transactions) and
//! an append-only table of events. Every admitted write is appended in the
//! same transaction that changes the counter, so the history of admitted
//! writes is exactly the list of writes that took effect, in commit order.

use std::{
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fencelock::{Error, FencingToken};
use fencelock_sqlite::SqliteFence;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The fenced resource: the counter.
pub const RESOURCE: &str = "torture-counter";

const SCHEMA: &str = "
CREATE TABLE torture_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO torture_counter (id, value) VALUES (1, 0);
-- seq is the commit order: every writer takes the database's write lock
-- (BEGIN IMMEDIATE) before it appends.
CREATE TABLE torture_events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL,
    worker        INTEGER,
    token         INTEGER,
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
    /// An operation failed (`detail`).
    Error,
    /// The nemesis injected a fault (`detail` = its kind) on `worker` (none
    /// for the server), from `t_start` to `t`.
    Fault,
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
            Kind::Error => "error",
            Kind::Fault => "fault",
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
            "error" => Kind::Error,
            "fault" => Kind::Fault,
            _ => return None,
        })
    }
}

/// Outcomes of admits and writes.
pub const ADMITTED: &str = "admitted";
/// A fence refused the token.
pub const REFUSED: &str = "refused";

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
            outcome: None,
            t_start_us: None,
            t_us,
            value_read: None,
            value_written: None,
            detail: None,
        }
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

    /// After a grant: records it and, fenced, admits the token before
    /// reading. `Ok(None)` when the fence refused the token (a newer holder
    /// has been admitted); `Ok(Some(value))` is the counter read.
    pub fn begin(&mut self, grant: Event) -> Result<Option<i64>, Error> {
        let (worker, token) = (grant.worker, grant.token.map(FencingToken));
        let fenced = self.fenced;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        append(&tx, &grant)?;
        if fenced {
            let token = token.ok_or_else(|| store_error("grant without token"))?;
            let admitted = admit(&tx, token)?;
            let outcome = if admitted { ADMITTED } else { REFUSED };
            append(
                &tx,
                &Event::new(Kind::Admit, worker, Some(token), now_us()).outcome(outcome),
            )?;
            if !admitted {
                tx.commit().map_err(sql)?;
                return Ok(None);
            }
        }
        let value = counter(&tx)?;
        let mut read = Event::new(Kind::Read, worker, token, now_us());
        read.value_read = Some(value);
        append(&tx, &read)?;
        tx.commit().map_err(sql)?;
        Ok(Some(value))
    }

    /// Writes `read + 1` carrying `token` (fenced: only if the fence still
    /// admits it), and records the attempt in the same transaction.
    pub fn write(
        &mut self,
        worker: u32,
        token: FencingToken,
        read: i64,
    ) -> Result<WriteOutcome, Error> {
        let started = now_us();
        let fenced = self.fenced;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        let outcome = if !fenced || admit(&tx, token)? {
            tx.execute(
                "UPDATE torture_counter SET value = ?1 WHERE id = 1",
                [read + 1],
            )
            .map_err(sql)?;
            WriteOutcome::Admitted
        } else {
            WriteOutcome::Refused
        };
        let mut event = Event::new(Kind::Write, Some(worker), Some(token), now_us())
            .started(started)
            .outcome(match outcome {
                WriteOutcome::Admitted => ADMITTED,
                WriteOutcome::Refused => REFUSED,
            });
        event.value_read = Some(read);
        event.value_written = Some(read + 1);
        append(&tx, &event)?;
        tx.commit().map_err(sql)?;
        Ok(outcome)
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

    /// The counter's value.
    pub fn counter(&self) -> Result<i64, Error> {
        counter(&self.conn)
    }

    /// Every event, in commit order.
    pub fn events(&self) -> Result<Vec<Event>, Error> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, kind, worker, token, outcome, t_start_us, t_us, value_read, \
                 value_written, detail FROM torture_events ORDER BY seq",
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

/// The fence, inside the caller's transaction: whether `token` is admitted.
fn admit(conn: &Connection, token: FencingToken) -> Result<bool, Error> {
    match SqliteFence::admit_in(conn, RESOURCE, token) {
        Ok(()) => Ok(true),
        Err(Error::Stale { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn counter(conn: &Connection) -> Result<i64, Error> {
    conn.query_row("SELECT value FROM torture_counter WHERE id = 1", [], |r| {
        r.get(0)
    })
    .optional()
    .map_err(sql)?
    .ok_or_else(|| store_error("the torture store has no counter"))
}

fn append(conn: &Connection, e: &Event) -> Result<(), Error> {
    conn.execute(
        "INSERT INTO torture_events (kind, worker, token, outcome, t_start_us, t_us, \
         value_read, value_written, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
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
        ],
    )
    .map_err(sql)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn grant(worker: u32, token: u64) -> Event {
        Event::new(
            Kind::Grant,
            Some(worker),
            Some(FencingToken(token)),
            now_us(),
        )
    }

    /// The admit-before-read protocol in the store itself: once a newer
    /// token has been admitted, the older holder's write is refused and the
    /// counter keeps the newer holder's value.
    #[test]
    fn a_stale_holder_cannot_write_after_a_newer_holder_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path).unwrap();
        let mut store = Store::open(&path, Duration::from_secs(5), true).unwrap();

        assert_eq!(store.begin(grant(0, 10)).unwrap(), Some(0));
        assert_eq!(store.begin(grant(1, 11)).unwrap(), Some(0));
        assert_eq!(
            store.write(0, FencingToken(10), 0).unwrap(),
            WriteOutcome::Refused
        );
        assert_eq!(
            store.write(1, FencingToken(11), 0).unwrap(),
            WriteOutcome::Admitted
        );
        assert_eq!(store.begin(grant(0, 10)).unwrap(), None);
        assert_eq!(store.counter().unwrap(), 1);
        assert_eq!(store.admitted_writes().unwrap(), 1);
        let kinds: Vec<Kind> = store.events().unwrap().iter().map(|e| e.kind).collect();
        use Kind::*;
        assert_eq!(
            kinds,
            [Grant, Admit, Read, Grant, Admit, Read, Write, Write, Grant, Admit]
        );
    }

    /// Unfenced, the same interleaving loses an update: the proof that the
    /// fence is what prevents it.
    #[test]
    fn unfenced_the_same_interleaving_loses_an_update() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path).unwrap();
        let mut store = Store::open(&path, Duration::from_secs(5), false).unwrap();

        let a = store.begin(grant(0, 10)).unwrap().unwrap();
        let b = store.begin(grant(1, 11)).unwrap().unwrap();
        assert_eq!(
            store.write(1, FencingToken(11), b).unwrap(),
            WriteOutcome::Admitted
        );
        assert_eq!(
            store.write(0, FencingToken(10), a).unwrap(),
            WriteOutcome::Admitted
        );
        assert_eq!(store.counter().unwrap(), 1);
        assert_eq!(store.admitted_writes().unwrap(), 2);
    }

    #[test]
    fn workers_between_read_and_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        Store::create(&path).unwrap();
        let mut store = Store::open(&path, Duration::from_secs(5), true).unwrap();
        store.begin(grant(0, 10)).unwrap();
        store.begin(grant(1, 11)).unwrap();
        store.write(1, FencingToken(11), 0).unwrap();
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
