//! The connections a backend or fence runs its statements on.
//!
//! Not sqlx's own pool: sqlx 0.8 hands a connection back to its pool in a
//! spawned task that first pings the server, so every lock operation cost
//! a task and a second round trip on the connection (measured in
//! `docs/benchmarks.md`; the choice is in `docs/decisions.md`). This pool is
//! deadpool's: a connection that completed its statements goes straight
//! back, with no task and no ping. One that did not (a time-out, a caller
//! that stopped waiting) is taken out of the pool and closed, so nothing
//! ever reuses a connection left mid-conversation. A connection that died
//! while idle fails its next statement with a transient error, which the
//! acquire loop and the renewer retry.

use std::{future::Future, pin::Pin, time::Duration};

use deadpool::{
    managed::{self, Metrics, Object, PoolError, RecycleResult},
    Runtime,
};
use sqlx::{
    query::{Query, QueryAs, QueryScalar},
    ConnectOptions, Connection, Database, Executor, FromRow, IntoArguments,
};

use crate::{bounded, resolve, timed_out, SqlUrl};

/// How an engine names a driver error of an operation (its `error::map`).
pub type MapError = fn(&'static str, sqlx::Error) -> fencelock_core::Error;

/// An engine's schema check on the first connection of a pool.
pub type SchemaCheck<'c> = Pin<Box<dyn Future<Output = fencelock_core::Result<()>> + Send + 'c>>;

impl SqlUrl {
    /// Runs one operation within the URL's operation time-out; a failure,
    /// giving up included (a transient error), is named by `map` with
    /// `context`.
    pub async fn bounded<T>(
        &self,
        context: &'static str,
        map: MapError,
        op: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> fencelock_core::Result<T> {
        bounded(self.op_timeout, op)
            .await
            .map_err(|e| map(context, e))
    }

    /// Opens a pool (see [`open_pool`]) and checks the schema on its first
    /// connection with `schema`, all within the connect time-out, and
    /// after the host resolved (an unknown one fails as soon as the
    /// resolver says so, see [`resolve`]). What each SQL engine does to
    /// connect.
    pub async fn open<DB: Database>(
        &self,
        connect: <DB::Connection as Connection>::Options,
        default_port: u16,
        transient: fn(&sqlx::Error) -> bool,
        map: MapError,
        schema: impl for<'c> FnOnce(&'c mut DB::Connection) -> SchemaCheck<'c>,
    ) -> fencelock_core::Result<ConnectionPool<DB>> {
        let limit = self.connect_timeout;
        let connecting = |e| map("connecting", e);
        let open = async {
            resolve(&self.driver_url, default_port, limit)
                .await
                .map_err(connecting)?;
            let (pool, mut first) = open_pool(
                connect,
                self.pool_max,
                self.acquire_timeout,
                limit,
                transient,
            )
            .await
            .map_err(connecting)?;
            schema(first.conn().map_err(connecting)?).await?;
            first.finish();
            Ok(pool)
        };
        tokio::time::timeout(limit, open)
            .await
            .unwrap_or_else(|_| Err(connecting(timed_out(limit))))
    }
}

/// Opens connections with one set of connect options.
pub struct Connector<DB: Database> {
    connect: <DB::Connection as Connection>::Options,
}

impl<DB: Database> managed::Manager for Connector<DB> {
    type Type = DB::Connection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<DB::Connection, sqlx::Error> {
        self.connect.connect().await
    }

    /// Nothing to check: only a [`Session`] that finished its statements
    /// returns a connection (see the module's comment).
    async fn recycle(&self, _: &mut DB::Connection, _: &Metrics) -> RecycleResult<sqlx::Error> {
        Ok(())
    }
}

/// A bounded pool of connections to one database. Cheap to clone.
pub struct ConnectionPool<DB: Database> {
    pool: managed::Pool<Connector<DB>>,
}

impl<DB: Database> Clone for ConnectionPool<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
        }
    }
}

impl<DB: Database> std::fmt::Debug for ConnectionPool<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("status", &self.pool.status())
            .finish()
    }
}

impl<DB: Database> ConnectionPool<DB> {
    /// At most `max` connections made with `connect`, connected on demand;
    /// taking one waits at most `acquire_timeout` for a free slot.
    pub fn new(
        connect: <DB::Connection as Connection>::Options,
        max: u32,
        acquire_timeout: Duration,
    ) -> Self {
        let pool = managed::Pool::builder(Connector { connect })
            .max_size(usize::try_from(max).unwrap_or(usize::MAX).max(1))
            .wait_timeout(Some(acquire_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            // Only a missing runtime fails the build, and one is given.
            .unwrap_or_else(|e| unreachable!("deadpool refused a pool with a runtime: {e}"));
        Self { pool }
    }

    /// A connection for one operation: an idle one, or a new one while
    /// fewer than the maximum exist. Waiting for a free slot ends with
    /// `PoolTimedOut` after the acquire time-out.
    pub async fn session(&self) -> Result<Session<DB>, sqlx::Error> {
        match self.pool.get().await {
            Ok(conn) => Ok(Session { conn: Some(conn) }),
            Err(PoolError::Backend(e)) => Err(e),
            Err(PoolError::Timeout(_)) => Err(sqlx::Error::PoolTimedOut),
            Err(PoolError::Closed) => Err(sqlx::Error::PoolClosed),
            Err(e) => Err(sqlx::Error::Protocol(e.to_string())),
        }
    }

    /// Connections open now, idle or in use.
    pub fn size(&self) -> usize {
        self.pool.status().size
    }
}

/// One statement on a pooled connection, handed back after: the shape of
/// most of the backends' and fences' operations (those with a transaction
/// take a [`Session`] of their own). The caller bounds the call by its
/// operation time-out.
impl<DB: Database> ConnectionPool<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Every row `query` returns.
    pub async fn fetch_all<'q, A>(
        &self,
        query: Query<'q, DB, A>,
    ) -> Result<Vec<DB::Row>, sqlx::Error>
    where
        A: 'q + IntoArguments<'q, DB>,
    {
        let mut s = self.session().await?;
        let rows = query.fetch_all(s.conn()?).await;
        s.finish_after(rows)
    }

    /// The row `query` returns, if any.
    pub async fn fetch_optional<'q, A>(
        &self,
        query: Query<'q, DB, A>,
    ) -> Result<Option<DB::Row>, sqlx::Error>
    where
        A: 'q + IntoArguments<'q, DB>,
    {
        let mut s = self.session().await?;
        let row = query.fetch_optional(s.conn()?).await;
        s.finish_after(row)
    }

    /// The value of the one column of the row `query` returns, if any.
    pub async fn fetch_optional_scalar<'q, O, A>(
        &self,
        query: QueryScalar<'q, DB, O, A>,
    ) -> Result<Option<O>, sqlx::Error>
    where
        O: Send + Unpin,
        A: 'q + IntoArguments<'q, DB>,
        (O,): Send + Unpin + for<'r> FromRow<'r, DB::Row>,
    {
        let mut s = self.session().await?;
        let value = query.fetch_optional(s.conn()?).await;
        s.finish_after(value)
    }

    /// The row `query` returns as an `O`, if any.
    pub async fn fetch_optional_as<'q, O, A>(
        &self,
        query: QueryAs<'q, DB, O, A>,
    ) -> Result<Option<O>, sqlx::Error>
    where
        O: Send + Unpin + for<'r> FromRow<'r, DB::Row>,
        A: 'q + IntoArguments<'q, DB>,
    {
        let mut s = self.session().await?;
        let row = query.fetch_optional(s.conn()?).await;
        s.finish_after(row)
    }

    /// Runs `query` for its effect: the rows it changed.
    pub async fn execute<'q, A>(&self, query: Query<'q, DB, A>) -> Result<u64, sqlx::Error>
    where
        A: 'q + IntoArguments<'q, DB>,
        DB::QueryResult: RowsAffected,
    {
        let mut s = self.session().await?;
        let done = query.execute(s.conn()?).await;
        s.finish_after(done).map(|done| done.rows_affected())
    }
}

/// A pooled connection for one operation. Unless the operation ends with
/// [`Session::finish`], the connection leaves the pool and is dropped with
/// the session: an operation abandoned mid-statement (a
/// [`crate::bounded`] time-out, or a caller that stops waiting) must not
/// hand a connection in mid-conversation to the next operation. Dropping
/// it also ends whatever the session held on the server (MySQL named locks
/// end with the session).
pub struct Session<DB: Database> {
    conn: Option<Object<Connector<DB>>>,
}

impl<DB: Database> Session<DB> {
    /// The connection.
    pub fn conn(&mut self) -> Result<&mut DB::Connection, sqlx::Error> {
        self.conn
            .as_deref_mut()
            .ok_or_else(|| sqlx::Error::Protocol("session already handed back".into()))
    }

    /// Hands the connection back to the pool: every statement on it has
    /// completed. One still inside a transaction (a `Transaction` dropped
    /// without commit queues its rollback for the next statement) is
    /// dropped instead, so the next operation starts clean.
    pub fn finish(mut self) {
        if let Some(conn) = self.conn.take() {
            if conn.is_in_transaction() {
                drop(Object::take(conn));
            }
        }
    }

    /// Ends the operation with its statements' `result`: the connection
    /// goes back to the pool when the statements completed, successfully
    /// or with an error the database reported; after a driver-level error
    /// (a reset, a protocol error) it is dropped, never reused.
    pub fn finish_after<T>(self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        match &result {
            Ok(_) | Err(sqlx::Error::Database(_) | sqlx::Error::RowNotFound) => self.finish(),
            Err(_) => drop(self),
        }
        result
    }
}

impl<DB: Database> Drop for Session<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

/// Opens a pool and makes its first connection now, within `limit`,
/// handing it to the caller (for the schema check), so that a one-shot
/// process uses exactly one connection. Errors that `transient` accepts,
/// such as "too many connections", are retried until four fifths of
/// `limit` have passed; if that ends without an answer, one direct attempt
/// in the time left names the cause instead of a bare time-out. A refused
/// connection is returned at once (still transient, so callers that wait
/// retry it on their own schedule): nothing listens on the port, which a
/// few more seconds rarely change, and a one-shot command with `--wait 0s`
/// must not spend the whole connect time-out learning that.
pub async fn open_pool<DB: Database>(
    connect: <DB::Connection as Connection>::Options,
    max: u32,
    acquire_timeout: Duration,
    limit: Duration,
    transient: fn(&sqlx::Error) -> bool,
) -> Result<(ConnectionPool<DB>, Session<DB>), sqlx::Error> {
    let pool = ConnectionPool::new(connect.clone(), max, acquire_timeout);
    let first = limit.mul_f64(0.8);
    let retry_until = tokio::time::Instant::now() + first;
    let mut backoff =
        fencelock_core::Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    let attempts = async {
        loop {
            match pool.session().await {
                Ok(conn) => return Ok(conn),
                Err(sqlx::Error::PoolTimedOut) => return Err(None),
                Err(e) if is_refused(&e) => return Err(Some(e)),
                Err(e) if transient(&e) => {
                    let pause = backoff.next_pause();
                    if tokio::time::Instant::now() + pause >= retry_until {
                        return Err(Some(e));
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(Some(e)),
            }
        }
    };
    match tokio::time::timeout_at(retry_until, attempts).await {
        Ok(Ok(conn)) => return Ok((pool, conn)),
        Ok(Err(Some(e))) => return Err(e),
        Ok(Err(None)) | Err(_) => {}
    }
    let silent = timed_out(limit);
    match tokio::time::timeout(limit.saturating_sub(first), connect.connect()).await {
        Ok(Err(cause)) => Err(cause),
        Ok(Ok(late)) => {
            // It answered at last; the pool will connect on its own.
            let _ = late.close().await;
            Err(silent)
        }
        Err(_) => Err(silent),
    }
}

/// Whether connecting failed because nothing listens at the address
/// (`ECONNREFUSED`), as opposed to a server that answered with an error.
fn is_refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// The rows a statement changed, as each engine's result reports them
/// (sqlx gives the count on each engine's own result type, not on the
/// generic one).
pub trait RowsAffected {
    /// The rows the statement changed (MySQL: matched).
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::mysql::MySqlQueryResult::rows_affected(self)
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}
