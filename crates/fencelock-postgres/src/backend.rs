//! [`PostgresBackend`]: every operation is one autocommit statement judged by
//! the server's clock.

use std::{
    fmt,
    future::Future,
    str::FromStr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use async_trait::async_trait;
use fencelock_core::{
    Acquire, AcquireRequest, Backend, Capabilities, Error, FencingToken, Grant, LeaseId, LockInfo,
    LockKey, Owner, Result, Stats, WakeHub, WakeSubscription,
};
use fencelock_sql_common::{bounded, micros_to_duration, ttl_micros, Session, SqlUrl};
use sqlx::{
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgPoolOptions, PgRow},
    PgPool, Postgres, Row,
};

use crate::{
    error::{bad_reply, map},
    listener::Listener,
    schema::{self, Names},
};

/// URL schemes this crate accepts.
pub(crate) const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The columns every lease-returning statement selects. `expires_in_us` is
/// computed by the server so no client clock takes part (I4). Data travels
/// as JSON text (see [`data_text`]).
const LEASE_COLUMNS: &str =
    "key, owner, token, kind, data::text AS data, acquired_at, expires_at, \
     (extract(epoch FROM expires_at - now()) * 1000000)::bigint AS expires_in_us";

/// How the backend was configured.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    url: SqlUrl,
    synchronous_commit_off: bool,
}

impl PostgresOptions {
    /// Parses a `postgres://` or `postgresql://` URL. Besides the driver's own
    /// parameters (`sslmode`, …) it accepts `table_prefix` (default
    /// `fencelock_`), `pool_max` (default 10), `acquire_timeout` (default
    /// `10s`), `connect_timeout` and `op_timeout` (default `5s` each) and
    /// `synchronous_commit=off` (the relaxed durability mode of
    /// `docs/postgres.md`).
    pub fn from_url(url: &str) -> Result<Self> {
        let url = fencelock_sql_common::parse(url, SCHEMES, &["synchronous_commit"])?;
        let mut synchronous_commit_off = false;
        for (name, value) in &url.extra {
            if name == "synchronous_commit" {
                synchronous_commit_off = match value.as_str() {
                    "on" => false,
                    "off" => true,
                    _ => {
                        return Err(fencelock_sql_common::invalid_url(
                            &url.driver_url,
                            "synchronous_commit must be on or off",
                        ))
                    }
                };
            }
        }
        Ok(Self {
            url,
            synchronous_commit_off,
        })
    }

    /// The table prefix in use.
    pub fn table_prefix(&self) -> &str {
        &self.url.prefix
    }

    /// Whether lock statements commit without waiting for the WAL flush.
    pub fn synchronous_commit_off(&self) -> bool {
        self.synchronous_commit_off
    }

    pub(crate) fn names(&self) -> Names {
        Names::new(&self.url.prefix)
    }

    /// How long connecting (schema check included) may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.url.connect_timeout
    }

    /// Runs one operation within the operation time-out; giving up is a
    /// transient error.
    pub(crate) async fn bounded<T>(
        &self,
        context: &'static str,
        op: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        bounded(self.url.op_timeout, op)
            .await
            .map_err(|e| map(context, e))
    }

    /// Opens the pool and the schema within the connect time-out.
    pub(crate) async fn open(&self, relaxed: bool) -> Result<PgPool> {
        let limit = self.url.connect_timeout;
        let open = async {
            let (pool, mut first) = self.pool(relaxed).await?;
            schema::ensure(&mut first, &self.names(), limit).await?;
            fencelock_sql_common::return_to_pool(first).await;
            Ok(pool)
        };
        tokio::time::timeout(limit, open)
            .await
            .unwrap_or_else(|_| Err(map("connecting", fencelock_sql_common::timed_out(limit))))
    }

    /// How to connect; `relaxed` applies `synchronous_commit = off`.
    pub(crate) fn connect_options(&self, relaxed: bool) -> Result<PgConnectOptions> {
        let connect = PgConnectOptions::from_str(self.url.driver_url.as_str())
            .map_err(|e| fencelock_sql_common::invalid_url(&self.url.driver_url, e))?
            .application_name("fencelock");
        // A startup parameter, so it holds for every pooled session and no
        // statement needs a `SET` round trip or a transaction.
        Ok(if relaxed {
            connect.options([("synchronous_commit", "off")])
        } else {
            connect
        })
    }

    /// The wake-up listener's own connection: a pool of one, so that the
    /// LISTEN session, which is held forever, never takes a slot of the
    /// pool that runs the lock statements. Nothing connects until the
    /// listener starts.
    fn listener_pool(&self) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.url.connect_timeout)
            .connect_lazy_with(self.connect_options(false)?))
    }

    /// A pool and its first connection; `relaxed` applies
    /// `synchronous_commit = off` to its sessions.
    async fn pool(&self, relaxed: bool) -> Result<(PgPool, PoolConnection<Postgres>)> {
        let connect = self.connect_options(relaxed)?;
        // No ping on checkout: it would double the round trips of every
        // lock operation (measured: docs/benchmarks.md). A connection that
        // died in the pool fails its statement with a transient error, which
        // the waiting loop and the renewal watchdog retry.
        let options = PgPoolOptions::new()
            .max_connections(self.url.pool_max)
            .acquire_timeout(self.url.acquire_timeout)
            .test_before_acquire(false);
        fencelock_sql_common::open_pool(
            options,
            connect,
            self.url.connect_timeout,
            crate::error::is_transient,
        )
        .await
        .map_err(|e| map("connecting", e))
    }
}

pub(crate) struct Sql {
    pub(crate) acquire: String,
    renew: String,
    pub(crate) release: String,
    inspect: String,
    list: String,
    force_release: String,
    release_all: String,
    cleanup: String,
    stats: String,
}

impl Sql {
    pub(crate) fn new(n: &Names) -> Self {
        let (locks, tokens, channel) = (&n.locks, &n.tokens, &n.channel);
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
            acquire: format!(
                "WITH turn AS MATERIALIZED (
                   SELECT pg_advisory_xact_lock(hashtext('{locks}'), hashtext($1))
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
                     updated_at = EXCLUDED.updated_at
                   WHERE l.expires_at <= now()
                   RETURNING *
                 )
                 SELECT true AS won, {LEASE_COLUMNS} FROM won
                 UNION ALL
                 SELECT false, {LEASE_COLUMNS} FROM {locks}
                  WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT 1 FROM won)"
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
                 SELECT pg_notify('{channel}', key)::text FROM gone"
            ),
            inspect: format!(
                "SELECT {LEASE_COLUMNS} FROM {locks} WHERE key = $1 AND expires_at > now()"
            ),
            // `starts_with` compares literally: no LIKE wildcards to escape.
            list: format!(
                "SELECT {LEASE_COLUMNS} FROM {locks}
                  WHERE expires_at > now() AND ($1::text IS NULL OR starts_with(key, $1))
                  ORDER BY key"
            ),
            force_release: format!(
                "WITH gone AS (
                   DELETE FROM {locks} WHERE key = $1 AND expires_at > now() RETURNING *)
                 SELECT {LEASE_COLUMNS}, pg_notify('{channel}', key)::text FROM gone"
            ),
            release_all: format!(
                "WITH gone AS (
                   DELETE FROM {locks} WHERE owner = $1 AND expires_at > now() RETURNING key)
                 SELECT pg_notify('{channel}', key)::text FROM gone"
            ),
            cleanup: format!("DELETE FROM {locks} WHERE expires_at <= now()"),
            // Live leases with their hold time, plus one row counting the
            // expired ones: the whole picture from one snapshot.
            stats: format!(
                "SELECT {LEASE_COLUMNS},
                        (extract(epoch FROM now() - acquired_at) * 1000000)::bigint AS held_us,
                        NULL::bigint AS expired
                   FROM {locks} WHERE expires_at > now()
                 UNION ALL
                 SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, count(*)
                   FROM {locks} WHERE expires_at <= now()"
            ),
        }
    }
}

/// The PostgreSQL lock backend. See `docs/postgres.md` for the schema, the
/// statements and why they keep invariants I1–I6.
pub struct PostgresBackend {
    pool: PgPool,
    options: PostgresOptions,
    sql: Sql,
    hub: WakeHub,
    listening: Arc<AtomicBool>,
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
        Self::with_options(PostgresOptions::from_url(url)?).await
    }

    /// Connects with parsed options.
    pub async fn with_options(options: PostgresOptions) -> Result<Self> {
        let pool = options.open(options.synchronous_commit_off).await?;
        Ok(Self {
            sql: Sql::new(&options.names()),
            pool,
            hub: WakeHub::new(),
            listening: Arc::new(AtomicBool::new(false)),
            listener_pool: options.listener_pool()?,
            listener: OnceLock::new(),
            options,
        })
    }

    /// Takes a pooled connection for one operation.
    async fn session(&self) -> std::result::Result<Session<Postgres>, sqlx::Error> {
        Session::acquire(&self.pool).await
    }

    /// The connection pool, e.g. to run the in-transaction fence on it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
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
    })
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
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let row = self
            .options
            .bounded("acquiring", async {
                let mut s = self.session().await?;
                let row = sqlx::query(&self.sql.acquire)
                    .bind(request.key.as_str())
                    .bind(request.owner.as_str())
                    .bind(request.kind.as_deref())
                    .bind(data_text(request.data.as_ref()))
                    .bind(ttl_micros(request.ttl))
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish();
                row
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

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let not_held = || Error::not_held(lease);
        let db_token = db_token(token).ok_or_else(not_held)?;
        let expires_at = self
            .options
            .bounded("renewing", async {
                let mut s = self.session().await?;
                let expires_at = sqlx::query_scalar(&self.sql.renew)
                    .bind(key.as_str())
                    .bind(owner.as_str())
                    .bind(db_token)
                    .bind(ttl_micros(ttl))
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish();
                expires_at
            })
            .await?
            .ok_or_else(not_held)?;
        Ok(Grant::new(token, ttl, expires_at))
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let Some(db_token) = db_token(token) else {
            return Err(Error::not_held(lease));
        };
        let rows = self
            .options
            .bounded("releasing", async {
                let mut s = self.session().await?;
                let rows = sqlx::query(&self.sql.release)
                    .bind(key.as_str())
                    .bind(owner.as_str())
                    .bind(db_token)
                    .fetch_all(s.conn()?)
                    .await;
                s.finish();
                rows
            })
            .await?;
        lease.found(!rows.is_empty())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.options
            .bounded("inspecting", async {
                let mut s = self.session().await?;
                let row = sqlx::query(&self.sql.inspect)
                    .bind(key.as_str())
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish();
                row
            })
            .await?
            .as_ref()
            .map(lease)
            .transpose()
    }

    async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockInfo>> {
        self.options
            .bounded("listing", async {
                let mut s = self.session().await?;
                let rows = sqlx::query(&self.sql.list)
                    .bind(prefix)
                    .fetch_all(s.conn()?)
                    .await;
                s.finish();
                rows
            })
            .await?
            .iter()
            .map(lease)
            .collect()
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.options
            .bounded("force-releasing", async {
                let mut s = self.session().await?;
                let row = sqlx::query(&self.sql.force_release)
                    .bind(key.as_str())
                    .fetch_optional(s.conn()?)
                    .await;
                s.finish();
                row
            })
            .await?
            .as_ref()
            .map(lease)
            .transpose()
    }

    async fn release_all(&self, owner: &Owner) -> Result<u64> {
        let rows = self
            .options
            .bounded("releasing all", async {
                let mut s = self.session().await?;
                let rows = sqlx::query(&self.sql.release_all)
                    .bind(owner.as_str())
                    .fetch_all(s.conn()?)
                    .await;
                s.finish();
                rows
            })
            .await?;
        Ok(rows.len() as u64)
    }

    async fn cleanup_expired(&self) -> Result<u64> {
        Ok(self
            .options
            .bounded("cleaning up", async {
                let mut s = self.session().await?;
                let done = sqlx::query(&self.sql.cleanup).execute(s.conn()?).await;
                s.finish();
                done
            })
            .await?
            .rows_affected())
    }

    async fn stats(&self) -> Result<Stats> {
        let rows = self
            .options
            .bounded("computing stats", async {
                let mut s = self.session().await?;
                let rows = sqlx::query(&self.sql.stats).fetch_all(s.conn()?).await;
                s.finish();
                rows
            })
            .await?;
        let mut leases = Vec::with_capacity(rows.len());
        let mut expired = 0;
        for row in &rows {
            let count: Option<i64> = row.try_get("expired").map_err(|e| map("stats", e))?;
            match count {
                Some(n) => expired = u64::try_from(n).unwrap_or(0),
                None => {
                    let held: i64 = row.try_get("held_us").map_err(|e| map("stats", e))?;
                    leases.push((lease(row)?, micros_to_duration(held)));
                }
            }
        }
        Ok(Stats::from_leases(
            leases.iter().map(|(l, d)| (l, *d)),
            expired,
        ))
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        // The LISTEN session costs a connection of its own, so it is opened
        // only once somebody waits: a one-shot process that does not wait
        // uses one connection.
        let mut starting = false;
        self.listener.get_or_init(|| {
            starting = true;
            Listener::spawn(
                self.listener_pool.clone(),
                self.options.names().channel,
                self.hub.clone(),
                Arc::clone(&self.listening),
                self.options.connect_timeout(),
            )
        });
        // A subscription taken while the listener starts fires once it
        // listens (it wakes everyone then), or ends if it cannot connect.
        // While a running listener is down a subscription would never
        // fire; say so, and the waiter backs off with jitter instead.
        if !starting && !self.listening.load(Ordering::SeqCst) {
            return Ok(None);
        }
        Ok(Some(self.hub.subscribe(key.as_str())))
    }
}
