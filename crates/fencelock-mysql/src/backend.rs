//! [`MySqlBackend`]: atomic statements judged by the server's `NOW(6)`.

use std::{fmt, time::Duration};

use async_trait::async_trait;
use fencelock_core::{
    renew_writers_batched, Acquire, AcquireAll, AcquireRequest, Backend, Capabilities, Error,
    FencingToken, Grant, LeaseId, LockInfo, LockKey, LockMode, Owner, Renewal, Result,
};
use fencelock_sql_common::{bounded, micros_to_duration, ttl_micros, ConnectionPool, Session};
use sqlx::{mysql::MySqlRow, MySql, MySqlConnection, Row};

use crate::{
    error::{bad_reply, is_deadlock, map, map_grant, retry_deadlocks, DEADLOCK_RETRIES},
    options::MySqlOptions,
    schema::Names,
};

mod admin;
mod shared;

/// The columns every lease-returning statement selects; `expires_in_us` is
/// computed by the server so no client clock takes part (I4).
/// The key is aliased because `DELETE … RETURNING` names a bare `key`
/// column differently from SELECT.
const LEASE_COLUMNS: &str =
    "`key` AS lock_key, owner, token, kind, data, acquired_at, expires_at, \
     TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) AS expires_in_us";

/// How long an acquisition waits for another acquisition of the same key to
/// commit (a few milliseconds normally; long only if that session stalls).
const TURN_WAIT_SECS: u32 = 10;

/// A locks row that stores nothing: its lease ended, no reader's lease on
/// the key lives past now, and no writer's intent does.
const DEAD: &str = "expires_at <= NOW(6) AND (readers_until IS NULL OR readers_until <= NOW(6)) \
                    AND (intent_until IS NULL OR intent_until <= NOW(6))";

/// `expires_at` of a locks row made for readers or an intent: long past.
const NO_LEASE: &str = "'1970-01-01 00:00:01'";

pub(crate) struct Sql {
    /// Draws the next token: see [`draw_token`].
    draw: String,
    counter: String,
    locks: String,
    take_turn: String,
    give_turn: String,
    gate: String,
    horizon: String,
    shared_insert: String,
    shared_granted: String,
    shared_renew: String,
    shared_renewed: String,
    shared_release: String,
    recompute_horizon: String,
    last_reader: String,
    list_readers: String,
    stats_readers: String,
    cleanup_readers: String,
    post_intent: String,
    withdraw_intent: String,
    owner_reader_keys: String,
    release_owner_readers: String,
    force_delete_readers: String,
    pub(crate) acquire: String,
    pub(crate) acquire_result: String,
    renew: String,
    renewed: String,
    pub(crate) release: String,
    inspect: String,
    list: String,
    force_delete: String,
    release_all: String,
    cleanup: String,
    stats: String,
    set_data: String,
}

impl Sql {
    pub(crate) fn new(n: &Names) -> Self {
        let (locks, counter, readers) = (&n.locks, &n.counter, &n.readers);
        // The name of the key's named lock: at most 64 characters whatever
        // the prefix and key, distinct per table and key. Takes the key as a
        // parameter.
        let turn = format!("CONCAT('fencelock:', MD5(CONCAT('{locks}', CHAR(0), ?)))");
        // ON DUPLICATE KEY UPDATE assigns left to right and later
        // assignments see earlier results, so every assignment tests the
        // *old* `expires_at`, which is therefore assigned last.
        // Free: the lease ended and so did every reader's (docs/rwlock.md).
        let free = "expires_at <= NOW(6) AND (readers_until IS NULL OR readers_until <= NOW(6))";
        let take = |column: &str, value: &str| format!("{column} = IF({free}, {value}, {column})");
        // A grant withdraws its owner's intent; `intent_until` first, while
        // `intent_owner` still names the intent's owner.
        let mine = format!("{free} AND intent_owner <=> VALUES(owner)");
        let updates = [
            format!("intent_until = IF({mine}, NULL, intent_until)"),
            format!("intent_owner = IF({mine}, NULL, intent_owner)"),
            take("owner", "VALUES(owner)"),
            take("kind", "VALUES(kind)"),
            take("data", "VALUES(data)"),
            take("acquired_at", "VALUES(acquired_at)"),
            take("updated_at", "VALUES(updated_at)"),
            // Drawn under the key's turn, after every earlier grant of the
            // key committed: above the token of the row being replaced (I2).
            take("token", "VALUES(token)"),
            take("expires_at", "VALUES(expires_at)"),
        ]
        .join(", ");
        Self {
            counter: counter.clone(),
            // One row advanced in its own (autocommitted) statement, like a
            // sequence: the value is the session's LAST_INSERT_ID() until
            // its next draw, so the statements that follow on the session
            // read it without a round trip. A value is never issued twice
            // (the row lock orders draws; the commit makes each durable
            // before it is used) and never below the floor.
            draw: format!("UPDATE {counter} SET v = {} WHERE id = 1", draw_expr("?")),
            locks: locks.clone(),
            // Reader operations run under the key's turn, the named lock
            // every acquisition of the key holds while it decides: a
            // writer's upsert cannot decide between a reader's look and
            // its write. Each statement after taking the turn reads the
            // newest committed rows (autocommit).
            take_turn: format!("SELECT GET_LOCK({turn}, {TURN_WAIT_SECS})"),
            give_turn: format!("SELECT RELEASE_LOCK({turn})"),
            gate: format!(
                "SELECT {LEASE_COLUMNS}, expires_at > NOW(6) AS live,
                        COALESCE(intent_until > NOW(6), FALSE) AS intent
                   FROM {locks} WHERE `key` = ?"
            ),
            // The key's reader horizon reaches the reader lease's end (a row
            // holding no lease is made for a key that has none).
            horizon: format!(
                "INSERT INTO {locks}
                   (`key`, owner, token, acquired_at, expires_at, updated_at, readers_until)
                 VALUES (?, ?, 0, NOW(6), {NO_LEASE}, NOW(6), ?)
                 ON DUPLICATE KEY UPDATE readers_until =
                   GREATEST(COALESCE(readers_until, VALUES(readers_until)), VALUES(readers_until))"
            ),
            shared_insert: format!(
                "INSERT INTO {readers}
                   (`key`, owner, token, kind, data, acquired_at, expires_at, updated_at)
                 VALUES (?, ?, LAST_INSERT_ID(), ?, ?, NOW(6),
                         NOW(6) + INTERVAL ? MICROSECOND, NOW(6))"
            ),
            shared_granted: format!(
                "SELECT {LEASE_COLUMNS}, 1 AS shared FROM {readers}
                  WHERE `key` = ? AND token = LAST_INSERT_ID()"
            ),
            shared_renew: format!(
                "UPDATE {readers}
                    SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, updated_at = NOW(6)
                  WHERE `key` = ? AND owner = ? AND token = ? AND expires_at > NOW(6)"
            ),
            shared_renewed: format!(
                "SELECT expires_at FROM {readers} WHERE `key` = ? AND token = ?"
            ),
            shared_release: format!(
                "DELETE FROM {readers}
                  WHERE `key` = ? AND owner = ? AND token = ? AND expires_at > NOW(6)"
            ),
            recompute_horizon: format!(
                "UPDATE {locks} SET readers_until =
                   (SELECT MAX(expires_at) FROM {readers} WHERE `key` = ? AND expires_at > NOW(6))
                  WHERE `key` = ?"
            ),
            last_reader: format!(
                "SELECT {LEASE_COLUMNS}, 1 AS shared FROM {readers}
                  WHERE `key` = ? AND expires_at > NOW(6) ORDER BY expires_at DESC LIMIT 1"
            ),
            list_readers: format!(
                "SELECT {LEASE_COLUMNS}, 1 AS shared FROM {readers}
                  WHERE expires_at > NOW(6) AND (? IS NULL OR LEFT(`key`, CHAR_LENGTH(?)) = ?)"
            ),
            stats_readers: format!(
                "SELECT e.expired, l.*
                   FROM (SELECT COUNT(*) AS expired FROM {readers} WHERE expires_at <= NOW(6)) e
                   LEFT JOIN (
                     SELECT {LEASE_COLUMNS}, 1 AS shared,
                            TIMESTAMPDIFF(MICROSECOND, acquired_at, NOW(6)) AS held_us
                       FROM {readers} WHERE expires_at > NOW(6)) l ON TRUE"
            ),
            cleanup_readers: format!("DELETE FROM {readers} WHERE expires_at <= NOW(6)"),
            // On the key's locks row (made if missing), which the readers'
            // gate reads under the turn. Another owner's live intent stays:
            // `intent_owner` is decided on the old values, then
            // `intent_until` follows whoever owns it now.
            post_intent: format!(
                "INSERT INTO {locks}
                   (`key`, owner, token, acquired_at, expires_at, updated_at,
                    intent_owner, intent_until)
                 VALUES (?, ?, 0, NOW(6), {NO_LEASE}, NOW(6), ?, NOW(6) + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE
                   intent_owner = IF(intent_owner <=> VALUES(intent_owner)
                                       OR intent_until IS NULL OR intent_until <= NOW(6),
                                     VALUES(intent_owner), intent_owner),
                   intent_until = IF(intent_owner <=> VALUES(intent_owner),
                                     VALUES(intent_until), intent_until)"
            ),
            withdraw_intent: format!(
                "UPDATE {locks} SET intent_owner = NULL, intent_until = NULL
                  WHERE `key` = ? AND intent_owner = ?"
            ),
            owner_reader_keys: format!(
                "SELECT DISTINCT `key` FROM {readers}
                  WHERE owner = ? AND expires_at > NOW(6) ORDER BY `key`"
            ),
            release_owner_readers: format!(
                "DELETE FROM {readers} WHERE `key` = ? AND owner = ? AND expires_at > NOW(6)"
            ),
            force_delete_readers: format!("DELETE FROM {readers} WHERE `key` = ?"),
            // Runs after [`upsert`] took the key's named lock ("its turn"),
            // which it keeps until `acquire_result` has run, i.e. until
            // after this statement committed, and drew the token. Without
            // the turn, a token drawn for the insert path before the row
            // exists could be overtaken by a rival's whole
            // acquire-and-release, and the insert would then carry a token
            // lower than one already issued (I2). With it, per key, tokens
            // are drawn in the order grants commit.
            acquire: format!(
                "INSERT INTO {locks}
                   (`key`, owner, token, kind, data, acquired_at, expires_at, updated_at)
                 VALUES (?, ?, LAST_INSERT_ID(), ?, ?, NOW(6),
                         NOW(6) + INTERVAL ? MICROSECOND, NOW(6))
                 ON DUPLICATE KEY UPDATE {updates}"
            ),
            // On the same session: the row carries the token this session
            // drew last iff the upsert wrote it, because every drawn value
            // is unique (and no table here has an AUTO_INCREMENT column that
            // would move LAST_INSERT_ID()). Affected-row counts cannot tell (the driver sets
            // CLIENT_FOUND_ROWS, so "insert" and "matched, unchanged" both
            // report 1). The outer join yields exactly one row, so the turn
            // is released even when the key has no row (force-released
            // meanwhile).
            acquire_result: format!(
                "SELECT RELEASE_LOCK({turn}) AS turn_released, {LEASE_COLUMNS},
                        token = LAST_INSERT_ID() AS won
                   FROM (SELECT 1) AS one LEFT JOIN {locks} ON `key` = ?"
            ),
            renew: format!(
                "UPDATE {locks}
                    SET expires_at = NOW(6) + INTERVAL ? MICROSECOND, updated_at = NOW(6)
                  WHERE `key` = ? AND owner = ? AND token = ? AND expires_at > NOW(6)"
            ),
            renewed: format!("SELECT expires_at FROM {locks} WHERE `key` = ? AND token = ?"),
            release: format!(
                "DELETE FROM {locks}
                  WHERE `key` = ? AND owner = ? AND token = ? AND expires_at > NOW(6)"
            ),
            inspect: format!(
                "SELECT {LEASE_COLUMNS} FROM {locks} WHERE `key` = ? AND expires_at > NOW(6)"
            ),
            // CLIENT_FOUND_ROWS: a match counts even when the data is the same.
            set_data: format!(
                "UPDATE {locks} SET data = ?
                  WHERE `key` = ? AND owner = ? AND token = ? AND expires_at > NOW(6)"
            ),
            // A literal prefix test: LEFT() has no wildcards to escape.
            list: format!(
                "SELECT {LEASE_COLUMNS} FROM {locks}
                  WHERE expires_at > NOW(6) AND (? IS NULL OR LEFT(`key`, CHAR_LENGTH(?)) = ?)
                  ORDER BY `key`"
            ),
            // The whole row: writer, reader horizon and intent.
            force_delete: format!("DELETE FROM {locks} WHERE `key` = ?"),
            release_all: format!("DELETE FROM {locks} WHERE owner = ? AND expires_at > NOW(6)"),
            cleanup: format!("DELETE FROM {locks} WHERE {DEAD}"),
            // The expired count joined to every live lease (or to one row of
            // NULLs): one statement, one NOW(6). A UNION would be shorter but
            // MariaDB widens the unioned BIGINT UNSIGNED token to DECIMAL.
            stats: format!(
                "SELECT e.expired, l.*
                   FROM (SELECT COUNT(*) AS expired FROM {locks} WHERE {DEAD}) e
                   LEFT JOIN (
                     SELECT {LEASE_COLUMNS},
                            TIMESTAMPDIFF(MICROSECOND, acquired_at, NOW(6)) AS held_us
                       FROM {locks} WHERE expires_at > NOW(6)) l ON TRUE"
            ),
        }
    }
}

/// The MySQL/MariaDB lock backend. See `docs/mysql.md`.
pub struct MySqlBackend {
    pool: ConnectionPool<MySql>,
    options: MySqlOptions,
    sql: Sql,
}

/// Atomic multi-key acquisition (`docs/multi-key.md`).
impl MySqlBackend {
    /// Takes every key's turn in the order given (sorted by the client),
    /// draws one token under all of them, then runs the acquisition upsert
    /// and its result query for each key in one transaction, committed only
    /// when every key was won.
    ///
    /// The draw is autocommitted before the transaction, as in
    /// `try_acquire`, so the counter's row is not locked for the
    /// transaction's length (a single-key acquisition waiting for it while
    /// holding a turn this call needs would otherwise wait out the turn's
    /// timeout). One token serves every key: it is above every token drawn
    /// before, so above each key's earlier grants (I2). Each key's turn is
    /// given back by its result query; from then on the uncommitted row's
    /// lock keeps rivals out until the commit or the rollback, and a rival
    /// that draws after that draws a higher token. Overlapping calls take
    /// turns in the same order, so they queue rather than deadlock; a
    /// deadlock the server still reports (with a reader's path) rolled the
    /// transaction back and is retried on a new session, closing the old
    /// one and with it the turns it held.
    async fn acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let floor = requests
            .iter()
            .try_fold(0, |top, request| floor(request).map(|f| top.max(f)))?;
        let attempt = async {
            let mut deadlocks = 0;
            loop {
                let mut session = self.session().await?;
                for request in requests {
                    take_turn(session.conn()?, &self.sql, request.key.as_str()).await?;
                }
                draw_token(session.conn()?, &self.sql, floor).await?;
                let mut tx = sqlx::Connection::begin(session.conn()?).await?;
                let mut rows = Vec::with_capacity(requests.len());
                let mut refused = None;
                let mut failed = None;
                for (index, request) in requests.iter().enumerate() {
                    let key = request.key.as_str();
                    let upsert = sqlx::query(&self.sql.acquire)
                        .bind(key)
                        .bind(request.owner.as_str())
                        .bind(request.kind.as_deref())
                        .bind(request.data.as_ref())
                        .bind(ttl_micros(request.ttl))
                        .execute(&mut *tx)
                        .await;
                    if let Err(e) = upsert {
                        failed = Some(e);
                        break;
                    }
                    let row = sqlx::query(&self.sql.acquire_result)
                        .bind(key)
                        .bind(key)
                        .fetch_one(&mut *tx)
                        .await?;
                    let won: Option<bool> = row.try_get("won")?;
                    if won != Some(true) {
                        refused = Some((index, row));
                        break;
                    }
                    rows.push(row);
                }
                match failed {
                    // The server rolled the transaction back whole: again.
                    Some(e) if is_deadlock(&e) && deadlocks < DEADLOCK_RETRIES => {
                        deadlocks += 1;
                        continue;
                    }
                    Some(e) => return Err(e),
                    None => {}
                }
                let Some((index, row)) = refused else {
                    tx.commit().await?;
                    session.finish();
                    return Ok(Err(rows));
                };
                tx.rollback().await?;
                // The turns of the keys after the refused one are still ours.
                for request in &requests[index + 1..] {
                    give_turn(session.conn()?, &self.sql, request.key.as_str()).await?;
                }
                session.finish();
                return Ok(Ok((index, row)));
            }
        };
        let answer = bounded(self.options.url.op_timeout, attempt)
            .await
            .map_err(|e| match requests.first() {
                // One counter for every key: its end is every key's.
                Some(first) => map_grant("acquiring several keys", &first.key, e),
                None => map("acquiring several keys", e),
            })?;
        let rows = match answer {
            Ok((index, row)) => {
                let holder = if text(&row, "lock_key")?.is_none() {
                    None
                } else {
                    let info = lease(&row)?;
                    if info.expires_in.is_zero() {
                        // No live writer: readers kept it out, if anyone.
                        self.last_reader(info.key.as_str()).await?
                    } else {
                        Some(info)
                    }
                };
                return Ok(AcquireAll::Held { index, holder });
            }
            Err(rows) => rows,
        };
        requests
            .iter()
            .zip(rows)
            .map(|(request, row)| {
                let info = lease(&row)?;
                Ok(Grant::new(info.token, request.ttl, info.expires_at))
            })
            .collect::<Result<Vec<_>>>()
            .map(AcquireAll::Granted)
    }
}

impl fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl MySqlBackend {
    /// Connects with the options of `url` (see [`MySqlOptions::from_url`])
    /// and creates the schema if needed.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(MySqlOptions::from_url(url)?).await
    }

    /// Connects with parsed options.
    pub async fn connect_with(options: MySqlOptions) -> Result<Self> {
        Ok(Self {
            sql: Sql::new(&options.names()),
            pool: options.open().await?,
            options,
        })
    }

    /// Takes a pooled connection for one operation.
    async fn session(&self) -> std::result::Result<Session<MySql>, sqlx::Error> {
        self.pool.session().await
    }

    /// The live reader of `key` whose lease ends last.
    async fn last_reader(&self, key: &str) -> Result<Option<LockInfo>> {
        self.options
            .bounded(
                "inspecting",
                self.pool
                    .fetch_optional(sqlx::query(&self.sql.last_reader).bind(key)),
            )
            .await?
            .as_ref()
            .map(lease)
            .transpose()
    }
}

/// The floor an acquisition's draw is given: `min_token` (at most
/// [`fencelock_core::FencingToken::MAX_FLOOR`]), or 0.
fn floor(request: &AcquireRequest) -> Result<u64> {
    request.floor()
}

/// The counter's next value, above `floor` (SQL text: a placeholder or a
/// literal, bound twice when a placeholder), as `LAST_INSERT_ID(…)`. At
/// [`fencelock_core::FencingToken::MAX`] the statement fails instead of
/// drawing: `v + 18446744073709551615` overflows `BIGINT UNSIGNED`
/// (server error 1690) and the counter stays where it is, so the end of
/// the tokens is an error (`map_grant`), never a token past the limit. The
/// overflow is in `v`, not in constants, so the server cannot fold it
/// into an error for every draw.
fn draw_expr(floor: &str) -> String {
    let max = fencelock_core::FencingToken::MAX.get();
    format!(
        "LAST_INSERT_ID(IF(GREATEST(v, {floor}) < {max}, GREATEST(v, {floor}) + 1, \
         v + 18446744073709551615))"
    )
}

/// Draws the next token, above `floor` and every token drawn before, as
/// this session's `LAST_INSERT_ID()`. Floors raise the one counter, so
/// concurrent floors and draws for other keys can neither repeat nor lower
/// a token (I2).
async fn draw_token(
    conn: &mut MySqlConnection,
    sql: &Sql,
    floor: u64,
) -> std::result::Result<(), sqlx::Error> {
    let matched = sqlx::query(&sql.draw)
        .bind(floor)
        .bind(floor)
        .execute(conn)
        .await?
        .rows_affected();
    // Without the row, LAST_INSERT_ID() would still hold an older value.
    if matched == 1 {
        Ok(())
    } else {
        Err(sqlx::Error::RowNotFound)
    }
}

/// The name of `key`'s turn (as `Sql::new`'s `turn` computes it from a
/// parameter) from the key written as a hexadecimal literal: the same
/// bytes, so the same name, in text that needs no escaping.
fn turn_of_literal(sql: &Sql, key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02X}")).collect();
    format!(
        "CONCAT('fencelock:', MD5(CONCAT('{}', CHAR(0), X'{hex}')))",
        sql.locks
    )
}

/// The acquisition's first statements on `conn`: take the key's turn and
/// draw the token in one round trip (two statements in one text-protocol
/// request: bound parameters would need one prepared statement, and one
/// round trip, each), then run the upsert. The draw only happens while the
/// session holds the turn (`IS_USED_LOCK`, which does not wait, evaluated
/// under the counter's row lock), so "one row drawn" means both happened.
/// The caller reads the outcome with `acquire_result`, which gives the turn
/// back, or closes the session.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn upsert(
    conn: &mut MySqlConnection,
    sql: &Sql,
    key: &str,
    owner: &str,
    kind: Option<&str>,
    data: Option<&serde_json::Value>,
    ttl: Duration,
    floor: u64,
) -> std::result::Result<(), sqlx::Error> {
    let turn = turn_of_literal(sql, key);
    let turn_and_draw = format!(
        "SELECT GET_LOCK({turn}, {TURN_WAIT_SECS});
         UPDATE {} SET v = {}
          WHERE id = 1 AND IS_USED_LOCK({turn}) = CONNECTION_ID()",
        sql.counter,
        draw_expr(&floor.to_string())
    );
    // A plain `&str` runs on the text protocol, which takes several
    // statements in one request.
    let drawn = sqlx::Executor::execute(&mut *conn, turn_and_draw.as_str())
        .await?
        .rows_affected();
    if drawn != 1 {
        // Transient: another acquisition of the key kept its turn past the
        // wait (the counter's row exists once the schema is complete).
        return Err(sqlx::Error::PoolTimedOut);
    }
    sqlx::query(&sql.acquire)
        .bind(key)
        .bind(owner)
        .bind(kind)
        .bind(data)
        .bind(ttl_micros(ttl))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Reads a `utf8mb4_nopad_bin` column, which the driver reports as
/// VARBINARY (binary collations carry the BINARY flag) and so will not
/// decode as `String` directly.
fn text(row: &MySqlRow, column: &str) -> Result<Option<String>> {
    row.try_get::<Option<Vec<u8>>, _>(column)
        .map_err(|e| map("reading a lease", e))?
        .map(|bytes| {
            String::from_utf8(bytes).map_err(|_| bad_reply(format!("{column} is not UTF-8")))
        })
        .transpose()
}

fn lease(row: &MySqlRow) -> Result<LockInfo> {
    let get = |e: sqlx::Error| map("reading a lease", e);
    let required =
        |column: &str| text(row, column)?.ok_or_else(|| bad_reply(format!("{column} is NULL")));
    Ok(LockInfo {
        key: LockKey::new(required("lock_key")?)?,
        owner: Owner::new(required("owner")?)?,
        token: FencingToken(row.try_get("token").map_err(get)?),
        kind: text(row, "kind")?,
        data: row.try_get("data").map_err(get)?,
        acquired_at: row.try_get("acquired_at").map_err(get)?,
        expires_at: row.try_get("expires_at").map_err(get)?,
        expires_in: micros_to_duration(row.try_get("expires_in_us").map_err(get)?),
        // Statements that return readers select `shared`; the others
        // return writers only.
        mode: match row.try_get::<Option<i64>, _>("shared") {
            Ok(Some(1)) => LockMode::Shared,
            _ => LockMode::Exclusive,
        },
    })
}

/// Runs `$body` (statements on `$conn`) on one session while it holds
/// `$key`'s turn, bounded by the operation timeout. On any failure the
/// session is closed rather than pooled, which frees the turn.
macro_rules! under_turn {
    ($self:ident, $operation:expr, $key:expr, |$conn:ident| $body:block) => {
        under_turn!(@run bounded($operation), $self, $key, |$conn| $body)
    };
    // A body that draws a token for `$grant` (see `map_grant`).
    ($self:ident, grant $grant:expr, $operation:expr, $key:expr, |$conn:ident| $body:block) => {
        under_turn!(@run granting($operation, $grant), $self, $key, |$conn| $body)
    };
    (@run $run:ident ( $($args:expr),* ), $self:ident, $key:expr, |$conn:ident| $body:block) => {
        $self.options.$run($($args,)* async {
            let mut s = $self.session().await?;
            $crate::backend::take_turn(s.conn()?, &$self.sql, $key).await?;
            let $conn = s.conn()?;
            let value: std::result::Result<_, sqlx::Error> = async { $body }.await;
            let value = value?;
            $crate::backend::give_turn(s.conn()?, &$self.sql, $key).await?;
            s.finish();
            Ok(value)
        })
    };
}
// A path for `admin.rs` and `shared.rs`, whose declarations come first.
pub(super) use under_turn;

/// Takes `key`'s turn on `conn` (a transient error if another session
/// keeps it past the wait). The caller gives it back with
/// [`give_turn`], or drops the session, which closes it and frees the turn.
pub(crate) async fn take_turn(
    conn: &mut MySqlConnection,
    sql: &Sql,
    key: &str,
) -> std::result::Result<(), sqlx::Error> {
    let got: Option<i64> = sqlx::query_scalar(&sql.take_turn)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    if got == Some(1) {
        Ok(())
    } else {
        Err(sqlx::Error::PoolTimedOut)
    }
}

pub(crate) async fn give_turn(
    conn: &mut MySqlConnection,
    sql: &Sql,
    key: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql.give_turn)
        .bind(key)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Stats rows (`stats` or `stats_readers`): the expired count on every row,
/// and a live lease with its hold time on each row that has one.
fn stats_rows(rows: &[MySqlRow]) -> Result<(Vec<(LockInfo, Duration)>, u64)> {
    let mut leases = Vec::with_capacity(rows.len());
    let mut expired = 0;
    for row in rows {
        let count: i64 = row.try_get("expired").map_err(|e| map("stats", e))?;
        expired = u64::try_from(count).unwrap_or(0);
        if text(row, "lock_key")?.is_some() {
            let held: i64 = row.try_get("held_us").map_err(|e| map("stats", e))?;
            leases.push((lease(row)?, micros_to_duration(held)));
        }
    }
    Ok((leases, expired))
}

#[async_trait]
impl Backend for MySqlBackend {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_persistent(true)
            .with_keeps_expired(true)
            .with_min_token(true)
            .with_batch_renew(true)
            .with_set_data(true)
            .with_shared(true)
            .with_atomic_multi(true)
    }

    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        self.acquire_all(requests).await
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if request.mode == LockMode::Shared {
            return self.acquire_reader(request).await;
        }
        let key = request.key.as_str();
        let floor = floor(request)?;
        let acquire = async {
            // A session dropped before `finish` is closed, freeing any turn
            // it held: after an error, or when the caller stops waiting
            // between the two statements.
            let mut session = retry_deadlocks(move || async move {
                let mut session = self.session().await?;
                upsert(
                    session.conn()?,
                    &self.sql,
                    key,
                    request.owner.as_str(),
                    request.kind.as_deref(),
                    request.data.as_ref(),
                    request.ttl,
                    floor,
                )
                .await?;
                Ok(session)
            })
            .await?;
            let row = sqlx::query(&self.sql.acquire_result)
                .bind(key)
                .bind(key)
                .fetch_one(session.conn()?)
                .await?;
            // The turn is released: the session may serve others.
            session.finish();
            Ok(row)
        };
        let row = bounded(self.options.url.op_timeout, acquire)
            .await
            .map_err(|e| map_grant("acquiring", &request.key, e))?;
        // No row for the key: our lease (if any) was already force-released.
        // Reporting "held by someone unknown" is the safe answer.
        if text(&row, "lock_key")?.is_none() {
            return Ok(Acquire::Held(None));
        }
        let info = lease(&row)?;
        let won: Option<bool> = row.try_get("won").map_err(|e| map("acquiring", e))?;
        Ok(if won == Some(true) {
            Acquire::Granted(Grant::new(info.token, request.ttl, info.expires_at))
        } else if info.expires_in.is_zero() {
            // No live writer: readers kept it out, if anyone (a waiting
            // writer is told which, to post its intent).
            Acquire::Held(self.last_reader(key).await?)
        } else {
            Acquire::Held(Some(info))
        })
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        if lease.mode == LockMode::Shared {
            return self.renew_reader(lease, ttl).await;
        }
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let expires_at = self
            .options
            .bounded("renewing", async {
                let mut s = self.session().await?;
                let matched = sqlx::query(&self.sql.renew)
                    .bind(ttl_micros(ttl))
                    .bind(key.as_str())
                    .bind(owner.as_str())
                    .bind(token.get())
                    .execute(s.conn()?)
                    .await?
                    .rows_affected();
                if matched == 0 {
                    s.finish();
                    return Ok(None);
                }
                // The new expiry, for display: UPDATE has no RETURNING here.
                let expires_at = sqlx::query_scalar(&self.sql.renewed)
                    .bind(key.as_str())
                    .bind(token.get())
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish_after(expires_at)
            })
            .await?
            .ok_or_else(|| Error::not_held(lease))?;
        Ok(Grant::new(token, ttl, expires_at))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        if lease.mode == LockMode::Shared {
            return self.release_reader(lease).await;
        }
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let deleted = self
            .options
            .bounded(
                "releasing",
                self.pool.execute(
                    sqlx::query(&self.sql.release)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(token.get()),
                ),
            )
            .await?;
        lease.found(deleted > 0)
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let changed = self
            .options
            .bounded(
                "setting data",
                self.pool.execute(
                    sqlx::query(&self.sql.set_data)
                        .bind(data.as_ref())
                        .bind(lease.key.as_str())
                        .bind(lease.owner.as_str())
                        .bind(lease.token.get()),
                ),
            )
            .await?;
        lease.found(changed > 0)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let writer = self
            .options
            .bounded(
                "inspecting",
                self.pool
                    .fetch_optional(sqlx::query(&self.sql.inspect).bind(key.as_str())),
            )
            .await?;
        match writer.as_ref().map(lease).transpose()? {
            Some(writer) => Ok(Some(writer)),
            None => self.last_reader(key.as_str()).await,
        }
    }

    fencelock_core::offers!(admin, write_intents);

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        // Readers have no batch statement: one renewal each.
        renew_writers_batched(self, renewals, |batch| async move {
            self.renew_writers(&batch).await
        })
        .await
    }
}

/// The exclusive side's batch renewal, beside the readers' operations in
/// `shared.rs`.
impl MySqlBackend {
    async fn renew_writers(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let locks = &self.sql.locks;
        // The batch as a derived table, one row per renewal with its ordinal.
        let table = (1..=renewals.len())
            .map(|i| match i {
                1 => "SELECT ? AS k, ? AS o, ? AS t, ? AS ttl, 1 AS i".to_owned(),
                i => format!("SELECT ?, ?, ?, ?, {i}"),
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let on = "l.`key` = b.k AND l.owner = b.o AND l.token = b.t";
        // One UPDATE judges every lease as `renew` does (I3) and stamps the
        // rows it extends with its own NOW(6), kept in a session variable;
        // the read on the same session finds them by that stamp (MariaDB's
        // UPDATE has no RETURNING). The variable may be left from an
        // earlier batch of this session when nothing matched now, so the
        // read also asks for a live lease: a row this UPDATE skipped was
        // expired and stays so. A lease renewed by another session between
        // the two statements reads as NotHeld: a loud answer, never a false
        // "held".
        let update = format!(
            "UPDATE {locks} AS l JOIN ({table}) AS b ON {on}
                SET l.expires_at = NOW(6) + INTERVAL b.ttl MICROSECOND,
                    l.updated_at = (@fencelock_renewed := NOW(6))
              WHERE l.expires_at > NOW(6)"
        );
        let read = format!(
            "SELECT b.i, l.expires_at FROM ({table}) AS b JOIN {locks} AS l ON {on}
              WHERE l.updated_at = @fencelock_renewed AND l.expires_at > NOW(6)"
        );
        let bind_batch = |sql| {
            renewals.iter().fold(sqlx::query(sql), |query, r| {
                query
                    .bind(r.lease.key.as_str())
                    .bind(r.lease.owner.as_str())
                    .bind(r.lease.token.get())
                    .bind(ttl_micros(r.ttl))
            })
        };
        let rows = self
            .options
            .bounded("renewing a batch", async {
                let mut s = self.session().await?;
                let matched = bind_batch(&update)
                    .execute(s.conn()?)
                    .await?
                    .rows_affected();
                if matched == 0 {
                    s.finish();
                    return Ok(Vec::new());
                }
                let rows = bind_batch(&read).fetch_all(s.conn()?).await;
                s.finish_after(rows)
            })
            .await?;
        fencelock_sql_common::renewal_answers(
            renewals,
            &rows,
            |e| map("renewing a batch", e),
            bad_reply,
        )
    }
}
