//! [`PostgresBackend`]: every operation is one autocommit statement judged by
//! the server's clock.

use std::{fmt, sync::OnceLock, time::Duration};

use async_trait::async_trait;
use fencelock_core::{
    renew_alone, renew_each_mode, Acquire, AcquireAll, AcquireRequest, Backend, Capabilities,
    ChangeFeed, Error, FencingToken, Grant, LeaseId, LockInfo, LockKey, LockMode, Owner, Renewal,
    Result, WakeSubscription,
};
use fencelock_sql_common::{micros_to_duration, ttl_micros, ConnectionPool, Session};

use sqlx::{
    postgres::{PgArguments, PgRow},
    query::Query,
    PgPool, Postgres, Row,
};

use crate::{
    error::{bad_reply, map},
    listener::{self, Listener},
    options::PostgresOptions,
    schema::Names,
};

mod admin;
mod shared;

/// The columns every lease-returning statement selects. `expires_in_us` is
/// computed by the server so no client clock takes part (I4). Data travels
/// as JSON text (see [`data_text`]).
const LEASE_COLUMNS: &str =
    "key, owner, token, kind, data::text AS data, acquired_at, expires_at, \
     (extract(epoch FROM expires_at - now()) * 1000000)::bigint AS expires_in_us";

/// A locks row that stores nothing is dead: its lease ended, no reader's
/// lease on the key lives past now, and no writer's intent does.
const DEAD: &str = "expires_at <= now() AND (readers_until IS NULL OR readers_until <= now()) \
                    AND (intent_until IS NULL OR intent_until <= now())";

pub(crate) struct Sql {
    pub(crate) acquire: String,
    turn: String,
    lock_keys: String,
    shared_gate: String,
    shared_insert: String,
    writer: String,
    renew_many_shared: String,
    release_shared: String,
    post_intent: String,
    withdraw_intent: String,
    owner_reader_keys: String,
    release_all_readers: String,
    floor_gate: String,
    raise_floor: String,
    renew: String,
    renew_many: String,
    pub(crate) release: String,
    inspect: String,
    list: String,
    force_release: String,
    release_all: String,
    cleanup: String,
    stats: String,
    set_data: String,
}

impl Sql {
    pub(crate) fn new(n: &Names) -> Self {
        let (locks, tokens, readers) = (&n.locks, &n.tokens, &n.readers);
        let channel = listener::channel_sql(locks);
        // Every grant and release also tells the table's change channel
        // (what `Backend::changes` follows).
        let changes = listener::changes_channel(locks);
        Self {
            // The upsert only overwrites an expired row (I1, I6). The token
            // is drawn from the sequence on every grant (I2).
            //
            // Drawing alone is not enough: on the insert path a token drawn
            // before the row exists could be overtaken by a rival that
            // inserts, commits and releases the key in between, leaving this
            // statement to insert a *lower* token. So the row to insert is
            // produced from `turn`, which first takes a transaction-scoped
            // advisory lock on the key (held until this statement commits):
            // per key, tokens are drawn in the order grants commit. The
            // two-int form keeps these locks apart from an application's
            // one-bigint advisory locks; the first int names the table.
            //
            // On the update path the token is drawn again under the row lock.
            // When the upsert did nothing, the second branch names the holder
            // from the statement's snapshot (it may miss a holder that
            // committed during the statement: then the answer is `Held(None)`).
            //
            // Every acquisition draws its tokens under a shared advisory
            // lock on the sequence (`draws`, taken before the key's turn);
            // raising the sequence to a floor (`raise_floor`) takes it
            // exclusively, so no draw runs while the floor is set.
            acquire: format!(
                "WITH draws AS MATERIALIZED (
                   SELECT pg_advisory_xact_lock_shared(hashtext('{tokens}'), 0)
                 ),
                 turn AS MATERIALIZED (
                   SELECT pg_advisory_xact_lock(hashtext('{locks}'), hashtext($1)) FROM draws
                 ),
                 won AS (
                   INSERT INTO {locks} AS l
                     (key, owner, token, kind, data, acquired_at, expires_at, updated_at)
                   SELECT $1, $2, nextval('{tokens}'), $3::text, $4::text::json, now(),
                          now() + $5::bigint * interval '1 microsecond', now()
                     FROM turn
                   ON CONFLICT (key) DO UPDATE SET
                     owner = EXCLUDED.owner, token = nextval('{tokens}'),
                     kind = EXCLUDED.kind, data = EXCLUDED.data,
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                     updated_at = EXCLUDED.updated_at,
                     intent_owner = NULLIF(l.intent_owner, EXCLUDED.owner),
                     intent_until = CASE WHEN l.intent_owner = EXCLUDED.owner THEN NULL
                                         ELSE l.intent_until END
                   WHERE l.expires_at <= now()
                     AND (l.readers_until IS NULL OR l.readers_until <= now())
                   RETURNING *, pg_notify('{changes}', l.key)::text AS notified
                 )
                 SELECT true AS won, {LEASE_COLUMNS}, false AS shared FROM won
                 UNION ALL
                 SELECT false, {LEASE_COLUMNS}, false FROM {locks}
                  WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT 1 FROM won)
                 UNION ALL
                 (SELECT false, {LEASE_COLUMNS}, true FROM {readers}
                   WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT 1 FROM won)
                   ORDER BY expires_at DESC LIMIT 1)"
            ),
            // Readers take the key's turn in a statement of their own, so
            // that the statements after it see every grant committed
            // before (a single statement's snapshot predates its locks).
            turn: format!(
                "WITH draws AS MATERIALIZED (
                   SELECT pg_advisory_xact_lock_shared(hashtext('{tokens}'), 0)
                 )
                 SELECT pg_advisory_xact_lock(hashtext('{locks}'), hashtext($1))::text FROM draws"
            ),
            // The turns of several keys, always in key order (no deadlock
            // between two batches).
            lock_keys: format!(
                "SELECT pg_advisory_xact_lock(hashtext('{locks}'), hashtext(k))::text
                   FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS sorted"
            ),
            // A reader passes the gate on the key's locks row: no live
            // writer, no live intent. Passing raises the row's reader
            // horizon, which the writer's upsert re-checks on the newest row
            // version. A key without a row gets one that holds no lease.
            shared_gate: format!(
                "INSERT INTO {locks} AS l
                   (key, owner, token, acquired_at, expires_at, updated_at, readers_until)
                 VALUES ($1, $2, 0, now(), '-infinity', now(),
                         now() + $3::bigint * interval '1 microsecond')
                 ON CONFLICT (key) DO UPDATE
                   SET readers_until = GREATEST(l.readers_until, EXCLUDED.readers_until)
                 WHERE l.expires_at <= now()
                   AND (l.intent_until IS NULL OR l.intent_until <= now())
                 RETURNING key"
            ),
            shared_insert: format!(
                "INSERT INTO {readers}
                   (key, owner, token, kind, data, acquired_at, expires_at, updated_at)
                 VALUES ($1, $2, nextval('{tokens}'), $3::text, $4::text::json, now(),
                         now() + $5::bigint * interval '1 microsecond', now())
                 RETURNING {LEASE_COLUMNS}, true AS shared,
                           pg_notify('{changes}', key)::text AS notified"
            ),
            writer: format!(
                "SELECT {LEASE_COLUMNS} FROM {locks} WHERE key = $1 AND expires_at > now()"
            ),
            renew_many_shared: format!(
                "WITH r AS (
                   UPDATE {readers} AS l
                      SET expires_at = now() + b.ttl_us * interval '1 microsecond',
                          updated_at = now()
                     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                          WITH ORDINALITY AS b(key, owner, token, ttl_us, i)
                    WHERE l.key = b.key AND l.owner = b.owner AND l.token = b.token
                      AND l.expires_at > now()
                    RETURNING b.i, l.key, l.expires_at),
                 horizon AS (
                   UPDATE {locks} AS l SET readers_until = GREATEST(l.readers_until, x.e)
                     FROM (SELECT key, max(expires_at) AS e FROM r GROUP BY key) AS x
                    WHERE l.key = x.key)
                 SELECT i, expires_at FROM r"
            ),
            // Under the key's turn: the horizon becomes the end of the
            // remaining readers (this statement's snapshot still shows the
            // one it deletes, hence the exclusion).
            release_shared: format!(
                "WITH gone AS (
                   DELETE FROM {readers}
                    WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()
                   RETURNING key),
                 horizon AS (
                   UPDATE {locks} SET readers_until = (
                     SELECT max(expires_at) FROM {readers} AS r
                      WHERE r.key = $1 AND r.expires_at > now()
                        AND NOT (r.owner = $2 AND r.token = $3))
                    WHERE key = $1 AND EXISTS (SELECT 1 FROM gone))
                 SELECT pg_notify({channel}, key)::text, pg_notify('{changes}', key)::text
                   FROM gone"
            ),
            // On the key's locks row (one that holds no lease if the key
            // has none), which the readers' gate re-checks. Another owner's
            // live intent stays.
            post_intent: format!(
                "INSERT INTO {locks} AS l
                   (key, owner, token, acquired_at, expires_at, updated_at,
                    intent_owner, intent_until)
                 VALUES ($1, $2, 0, now(), '-infinity', now(),
                         $2, now() + $3::bigint * interval '1 microsecond')
                 ON CONFLICT (key) DO UPDATE
                   SET intent_owner = EXCLUDED.intent_owner,
                       intent_until = EXCLUDED.intent_until
                 WHERE l.intent_owner = EXCLUDED.intent_owner
                    OR l.intent_until IS NULL OR l.intent_until <= now()"
            ),
            withdraw_intent: format!(
                "WITH gone AS (
                   UPDATE {locks} SET intent_owner = NULL, intent_until = NULL
                    WHERE key = $1 AND intent_owner = $2 RETURNING key)
                 SELECT pg_notify({channel}, key)::text FROM gone"
            ),
            owner_reader_keys: format!(
                "SELECT DISTINCT key FROM {readers} WHERE owner = $1 AND expires_at > now()"
            ),
            release_all_readers: format!(
                "WITH gone AS (
                   DELETE FROM {readers}
                    WHERE owner = $1 AND key = ANY($2::text[]) AND expires_at > now()
                   RETURNING key),
                 horizon AS (
                   UPDATE {locks} AS l SET readers_until = (
                     SELECT max(expires_at) FROM {readers} AS r
                      WHERE r.key = l.key AND r.expires_at > now() AND r.owner <> $1)
                    WHERE l.key = ANY($2::text[]))
                 SELECT pg_notify({channel}, key)::text, pg_notify('{changes}', key)::text
                   FROM gone"
            ),
            // Run in the acquiring transaction before `acquire`, one after
            // the other. With the exclusive lock, every draw before it has
            // committed and none can start, so `last_value` is the highest
            // token issued and setval moves the sequence forward only: the
            // next draw is above the floor and above every earlier token
            // (I2).
            floor_gate: format!("SELECT pg_advisory_xact_lock(hashtext('{tokens}'), 0)"),
            raise_floor: format!(
                "SELECT setval('{tokens}', GREATEST($1::bigint, last_value)) FROM {tokens}"
            ),
            // One statement for the whole batch, each lease judged as
            // `renew` judges it (I3); the ordinal says which renewals
            // matched. A lease named twice matches one row, which is
            // extended once; the other answer is NotHeld.
            renew_many: format!(
                "UPDATE {locks} AS l
                    SET expires_at = now() + b.ttl_us * interval '1 microsecond',
                        updated_at = now()
                   FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                        WITH ORDINALITY AS b(key, owner, token, ttl_us, i)
                  WHERE l.key = b.key AND l.owner = b.owner AND l.token = b.token
                    AND l.expires_at > now()
                  RETURNING b.i, l.expires_at"
            ),
            renew: format!(
                "UPDATE {locks} SET expires_at = now() + $4::bigint * interval '1 microsecond',
                        updated_at = now()
                  WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()
                  RETURNING expires_at"
            ),
            // NOTIFY is part of the statement, so it is delivered exactly
            // when the delete commits.
            release: format!(
                "WITH gone AS (
                   DELETE FROM {locks}
                    WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()
                   RETURNING key)
                 SELECT pg_notify({channel}, key)::text, pg_notify('{changes}', key)::text
                   FROM gone"
            ),
            // The writer, else the reader whose lease ends last.
            inspect: format!(
                "(SELECT {LEASE_COLUMNS}, false AS shared FROM {locks}
                   WHERE key = $1 AND expires_at > now())
                 UNION ALL
                 (SELECT {LEASE_COLUMNS}, true FROM {readers}
                   WHERE key = $1 AND expires_at > now() ORDER BY expires_at DESC LIMIT 1)
                 LIMIT 1"
            ),
            set_data: format!(
                "UPDATE {locks} SET data = $4::json
                  WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
            ),
            // `starts_with` compares literally: no LIKE wildcards to escape.
            list: format!(
                "SELECT {LEASE_COLUMNS}, false AS shared FROM {locks}
                  WHERE expires_at > now() AND ($1::text IS NULL OR starts_with(key, $1))
                 UNION ALL
                 SELECT {LEASE_COLUMNS}, true FROM {readers}
                  WHERE expires_at > now() AND ($1::text IS NULL OR starts_with(key, $1))
                  ORDER BY key, token"
            ),
            // Under the key's turn (readers may be joining): the key is freed
            // entirely, writer, readers, horizon and intent; the answer is
            // the writer, else the newest reader.
            force_release: format!(
                "WITH w AS (DELETE FROM {locks} WHERE key = $1 RETURNING *),
                 r AS (DELETE FROM {readers} WHERE key = $1 RETURNING *),
                 live AS (
                   SELECT {LEASE_COLUMNS}, false AS shared FROM w WHERE expires_at > now()
                   UNION ALL
                   (SELECT {LEASE_COLUMNS}, true FROM r WHERE expires_at > now()
                     ORDER BY token DESC LIMIT 1))
                 SELECT *, pg_notify({channel}, key)::text, pg_notify('{changes}', key)::text
                   FROM live LIMIT 1"
            ),
            release_all: format!(
                "WITH gone AS (
                   DELETE FROM {locks} WHERE owner = $1 AND expires_at > now() RETURNING key)
                 SELECT pg_notify({channel}, key)::text, pg_notify('{changes}', key)::text
                   FROM gone"
            ),
            cleanup: format!(
                "WITH w AS (DELETE FROM {locks} WHERE {DEAD} RETURNING 1),
                      r AS (DELETE FROM {readers} WHERE expires_at <= now() RETURNING 1)
                 SELECT (SELECT count(*) FROM w) + (SELECT count(*) FROM r)"
            ),
            // Live leases with their hold time, plus one row counting the
            // expired ones: the whole picture from one snapshot.
            stats: format!(
                "SELECT {LEASE_COLUMNS},
                        (extract(epoch FROM now() - acquired_at) * 1000000)::bigint AS held_us,
                        NULL::bigint AS expired, false AS shared
                   FROM {locks} WHERE expires_at > now()
                 UNION ALL
                 SELECT {LEASE_COLUMNS},
                        (extract(epoch FROM now() - acquired_at) * 1000000)::bigint,
                        NULL::bigint, true
                   FROM {readers} WHERE expires_at > now()
                 UNION ALL
                 SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                        (SELECT count(*) FROM {locks} WHERE {DEAD})
                        + (SELECT count(*) FROM {readers} WHERE expires_at <= now()), NULL"
            ),
        }
    }
}

/// The PostgreSQL lock backend. See `docs/postgres.md` for the schema, the
/// statements and why they keep invariants I1–I6.
pub struct PostgresBackend {
    pool: ConnectionPool<Postgres>,
    options: PostgresOptions,
    sql: Sql,
    /// Where the listener connects; it starts with the first waiter.
    listener_pool: PgPool,
    listener: OnceLock<Listener>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects with the options of `url` (see [`PostgresOptions::from_url`])
    /// and creates or upgrades the schema if needed. The wake-up listener
    /// connects when the first waiter subscribes.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(PostgresOptions::from_url(url)?).await
    }

    /// Connects with parsed options.
    pub async fn connect_with(options: PostgresOptions) -> Result<Self> {
        let pool = options.open(options.synchronous_commit_off()).await?;
        Ok(Self {
            sql: Sql::new(&options.names()),
            pool,
            listener_pool: options.listener_pool()?,
            listener: OnceLock::new(),
            options,
        })
    }

    /// Takes a pooled connection for one operation.
    async fn session(&self) -> std::result::Result<Session<Postgres>, sqlx::Error> {
        self.pool.session().await
    }
}

impl PostgresBackend {
    /// The acquisition upsert for `request` (see [`Sql::new`]).
    fn acquire_statement<'q>(
        &'q self,
        request: &'q AcquireRequest,
    ) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(&self.sql.acquire)
            .bind(request.key.as_str())
            .bind(request.owner.as_str())
            .bind(request.kind.as_deref())
            .bind(data_text(request.data.as_ref()))
            .bind(ttl_micros(request.ttl))
    }
}

/// The request's token floor as a sequence value (below
/// [`FencingToken::MAX_FLOOR`], so it always fits).
fn floor(request: &AcquireRequest) -> Result<Option<i64>> {
    if request.min_token.is_none() {
        return Ok(None);
    }
    Ok(Some(i64::try_from(request.floor()?).unwrap_or(i64::MAX)))
}

/// The batch's columns for `unnest`: keys, owners, tokens, TTLs.
fn batch_columns(renewals: &[Renewal]) -> (Vec<&str>, Vec<&str>, Vec<i64>, Vec<i64>) {
    let keys = renewals.iter().map(|r| r.lease.key.as_str()).collect();
    let owners = renewals.iter().map(|r| r.lease.owner.as_str()).collect();
    // A token above i64::MAX was never issued: -1 matches no row.
    let tokens = renewals
        .iter()
        .map(|r| db_token(r.lease.token).unwrap_or(-1))
        .collect();
    let ttls = renewals.iter().map(|r| ttl_micros(r.ttl)).collect();
    (keys, owners, tokens, ttls)
}

/// Tokens come from a bigint sequence, so any value above `i64::MAX` was
/// never issued and cannot hold a lease.
fn db_token(token: FencingToken) -> Option<i64> {
    i64::try_from(token.get()).ok()
}

/// Lease data as JSON text, for a `json` column. Not `jsonb`, and not the
/// driver's JSON binding (which sends `jsonb`): `jsonb` refuses valid JSON
/// such as `"\u0000"`, which PostgreSQL text cannot hold, while `json`
/// stores the text as given, so any valid JSON round-trips.
fn data_text(data: Option<&serde_json::Value>) -> Option<String> {
    data.map(serde_json::Value::to_string)
}

fn lease(row: &PgRow) -> Result<LockInfo> {
    let get = |e: sqlx::Error| map("reading a lease", e);
    let token: i64 = row.try_get("token").map_err(get)?;
    let data: Option<String> = row.try_get("data").map_err(get)?;
    Ok(LockInfo {
        key: LockKey::new(row.try_get::<String, _>("key").map_err(get)?)?,
        owner: Owner::new(row.try_get::<String, _>("owner").map_err(get)?)?,
        token: FencingToken(
            u64::try_from(token).map_err(|_| bad_reply(format!("negative token {token}")))?,
        ),
        kind: row.try_get("kind").map_err(get)?,
        data: data
            .map(|text| {
                serde_json::from_str(&text)
                    .map_err(|e| bad_reply(format!("lease data is not JSON: {e}")))
            })
            .transpose()?,
        acquired_at: row.try_get("acquired_at").map_err(get)?,
        expires_at: row.try_get("expires_at").map_err(get)?,
        expires_in: micros_to_duration(row.try_get("expires_in_us").map_err(get)?),
        // Statements that can return readers select `shared`; the others
        // return writers only.
        mode: match row.try_get::<Option<bool>, _>("shared") {
            Ok(Some(true)) => LockMode::Shared,
            _ => LockMode::Exclusive,
        },
    })
}

impl PostgresBackend {
    /// The LISTEN session, opened on first use: it costs a connection of
    /// its own, so a one-shot process that does not wait uses one
    /// connection.
    fn listener(&self) -> &Listener {
        self.listener.get_or_init(|| {
            Listener::spawn(
                self.listener_pool.clone(),
                self.options.names().locks,
                self.options.connect_timeout(),
            )
        })
    }
}

/// The exclusive side's batch statements, beside the readers' in
/// `shared.rs`, and the token floor both sides raise.
impl PostgresBackend {
    /// Raises the token sequence to `floor` on `conn`, inside the
    /// transaction that then draws: the gate serialises raises, and
    /// `setval` only moves the sequence forward (I2).
    async fn raise_floor(
        &self,
        conn: &mut sqlx::PgConnection,
        floor: i64,
    ) -> std::result::Result<(), sqlx::Error> {
        sqlx::query(&self.sql.floor_gate)
            .execute(&mut *conn)
            .await?;
        sqlx::query(&self.sql.raise_floor)
            .bind(floor)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Renews a batch of exclusive leases in one statement.
    async fn renew_writers(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let (keys, owners, tokens, ttls) = batch_columns(renewals);
        let rows = self
            .options
            .bounded(
                "renewing a batch",
                self.pool.fetch_all(
                    sqlx::query(&self.sql.renew_many)
                        .bind(&keys)
                        .bind(&owners)
                        .bind(&tokens)
                        .bind(&ttls),
                ),
            )
            .await?;
        fencelock_sql_common::renewal_answers(
            renewals,
            &rows,
            |e| map("renewing a batch", e),
            bad_reply,
        )
    }

    /// Releases an exclusive lease.
    async fn release_writer(&self, lease: &LeaseId) -> Result<()> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let Some(db_token) = db_token(token) else {
            return Err(Error::not_held(lease));
        };
        let rows = self
            .options
            .bounded(
                "releasing",
                self.pool.fetch_all(
                    sqlx::query(&self.sql.release)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(db_token),
                ),
            )
            .await?;
        lease.found(!rows.is_empty())
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
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
        if request.mode == LockMode::Shared {
            return self.acquire_reader(request).await;
        }
        let floor = floor(request)?;
        let row = self
            .options
            .granting("acquiring", &request.key, async {
                let mut s = self.session().await?;
                let acquire = self.acquire_statement(request);
                let row = match floor {
                    // The common case stays one autocommit statement.
                    None => acquire.fetch_optional(s.conn()?).await,
                    Some(floor) => {
                        let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                        self.raise_floor(&mut tx, floor).await?;
                        let row = acquire.fetch_optional(&mut *tx).await?;
                        tx.commit().await?;
                        Ok(row)
                    }
                };
                s.finish_after(row)
            })
            .await?;
        let Some(row) = row else {
            return Ok(Acquire::Held(None));
        };
        let info = lease(&row)?;
        let won: bool = row.try_get("won").map_err(|e| map("acquiring", e))?;
        Ok(if won {
            Acquire::Granted(Grant::new(info.token, request.ttl, info.expires_at))
        } else {
            Acquire::Held(Some(info))
        })
    }

    /// One transaction running the acquisition upsert for each key in the
    /// order given (sorted by the client): each takes its key's turn and row
    /// lock in that order, so two overlapping calls queue on their lowest
    /// common key instead of deadlocking, and the first key found held rolls
    /// every grant of the call back.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        // One sequence serves every key: raised once to the highest floor,
        // it puts every token of the call above its own floor.
        let mut top = None;
        for request in requests {
            top = top.max(floor(request)?);
        }
        let Some(first) = requests.first() else {
            return Ok(AcquireAll::Granted(Vec::new()));
        };
        let answer = self
            .options
            // One sequence for every key: when it ends, it ends for the
            // first key of the call as for all the others.
            .granting("acquiring", &first.key, async {
                let mut s = self.session().await?;
                let result = async {
                    let mut tx = sqlx::Connection::begin(s.conn()?).await?;
                    if let Some(floor) = top {
                        self.raise_floor(&mut tx, floor).await?;
                    }
                    let mut rows = Vec::with_capacity(requests.len());
                    for (index, request) in requests.iter().enumerate() {
                        let row = self
                            .acquire_statement(request)
                            .fetch_optional(&mut *tx)
                            .await?;
                        match row {
                            Some(row) if row.try_get::<bool, _>("won")? => rows.push(row),
                            held => {
                                tx.rollback().await?;
                                return Ok(Err((index, held)));
                            }
                        }
                    }
                    tx.commit().await?;
                    Ok(Ok(rows))
                }
                .await;
                s.finish_after(result)
            })
            .await?;
        match answer {
            Ok(rows) => requests
                .iter()
                .zip(rows)
                .map(|(request, row)| {
                    let info = lease(&row)?;
                    Ok(Grant::new(info.token, request.ttl, info.expires_at))
                })
                .collect::<Result<Vec<_>>>()
                .map(AcquireAll::Granted),
            Err((index, row)) => Ok(AcquireAll::Held {
                index,
                holder: row.as_ref().map(lease).transpose()?,
            }),
        }
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        if lease.mode == LockMode::Shared {
            return renew_alone(
                lease,
                ttl,
                |one| async move { self.renew_readers(&one).await },
            )
            .await;
        }
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let not_held = || Error::not_held(lease);
        let db_token = db_token(token).ok_or_else(not_held)?;
        let expires_at = self
            .options
            .bounded(
                "renewing",
                self.pool.fetch_optional_scalar(
                    sqlx::query_scalar(&self.sql.renew)
                        .bind(key.as_str())
                        .bind(owner.as_str())
                        .bind(db_token)
                        .bind(ttl_micros(ttl)),
                ),
            )
            .await?
            .ok_or_else(not_held)?;
        Ok(Grant::new(token, ttl, expires_at))
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        renew_each_mode(self.name(), renewals, |mode, batch| async move {
            match mode {
                LockMode::Exclusive => self.renew_writers(&batch).await,
                LockMode::Shared => self.renew_readers(&batch).await,
            }
        })
        .await
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        if lease.mode == LockMode::Shared {
            return self.release_reader(lease).await;
        }
        self.release_writer(lease).await
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let Some(db_token) = db_token(lease.token) else {
            return Err(Error::not_held(lease));
        };
        let changed = self
            .options
            .bounded(
                "setting data",
                self.pool.execute(
                    sqlx::query(&self.sql.set_data)
                        .bind(lease.key.as_str())
                        .bind(lease.owner.as_str())
                        .bind(db_token)
                        .bind(data_text(data.as_ref())),
                ),
            )
            .await?;
        lease.found(changed > 0)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.options
            .bounded(
                "inspecting",
                self.pool
                    .fetch_optional(sqlx::query(&self.sql.inspect).bind(key.as_str())),
            )
            .await?
            .as_ref()
            .map(lease)
            .transpose()
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        Ok(self.listener().subscribe(key).await)
    }

    async fn changes(&self) -> Result<Option<ChangeFeed>> {
        self.listener().changes().await.map(Some).ok_or_else(|| {
            fencelock_core::BackendError::message(
                "postgres",
                fencelock_core::ErrorStatus::Transient,
                "cannot LISTEN to the change channel now",
            )
            .into()
        })
    }

    fencelock_core::offers!(admin, write_intents);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencelock_core::{Acquire, AcquireRequest, Backend, LeaseId, LockKey, Owner};
    use fencelock_testkit::{servers::postgres::PostgresServer, TestResult};

    use super::PostgresBackend;

    /// Takes and releases `key` once, which notifies its channel.
    async fn cycle(backend: &PostgresBackend, key: &LockKey) -> TestResult {
        let owner = Owner::new("cycler")?;
        let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(60));
        let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
            return Err(format!("{key} not granted").into());
        };
        backend
            .release(&LeaseId::new(key.clone(), owner, grant.token))
            .await?;
        Ok(())
    }

    /// The listener receives the notices of the keys it has waiters for,
    /// and no others: not those of a key nobody waits for, nor those of a
    /// key whose last waiter has gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_waited_for_keys_reach_the_listener() -> TestResult {
        let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
        let url = server.url("postgres");
        let waiter = PostgresBackend::connect(&url).await?;
        let releaser = PostgresBackend::connect(&url).await?;
        let (a, b, c) = (LockKey::new("a")?, LockKey::new("b")?, LockKey::new("c")?);
        let mut on_b = waiter.subscribe(&b).await?.ok_or("no subscription")?;
        for _ in 0..20 {
            cycle(&releaser, &a).await?;
        }
        cycle(&releaser, &b).await?;
        let woken = tokio::time::timeout(Duration::from_secs(10), on_b.woken()).await;
        if !matches!(woken, Ok(true)) {
            return Err(format!("b's release did not wake its waiter: {woken:?}").into());
        }
        let listener = waiter.listener.get().ok_or("no listener")?;
        // Notices arrive in commit order: a's, had they been sent to this
        // listener, would have come before b's.
        assert_eq!(listener.notices(), 1, "notices of a key nobody waits for");
        drop(on_b);
        // Commands are served in order: once c is subscribed, b's channel
        // has been unlistened.
        let mut on_c = waiter.subscribe(&c).await?.ok_or("no subscription")?;
        cycle(&releaser, &b).await?;
        cycle(&releaser, &c).await?;
        let woken = tokio::time::timeout(Duration::from_secs(10), on_c.woken()).await;
        if !matches!(woken, Ok(true)) {
            return Err(format!("c's release did not wake its waiter: {woken:?}").into());
        }
        assert_eq!(listener.notices(), 2, "notices of a key whose waiter left");
        Ok(())
    }
}
