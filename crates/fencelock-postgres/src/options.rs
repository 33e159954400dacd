//! [`PostgresOptions`]: what a URL configures, and opening pools with it.

use std::{future::Future, str::FromStr, time::Duration};

use fencelock_core::Result;
use fencelock_sql_common::{bounded, ConnectionPool, SqlUrl};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool, Postgres,
};

use crate::{
    error::map,
    schema::{self, Names},
};

/// URL schemes this crate accepts.
pub(crate) const SCHEMES: &[&str] = &["postgres", "postgresql"];

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
        self.url.bounded(context, map, op).await
    }

    /// [`Self::bounded`] for a statement that draws tokens for `key`: the
    /// sequence's end (it stops at [`fencelock_core::FencingToken::MAX`])
    /// is [`fencelock_core::Error::TokensExhausted`], not a backend failure.
    pub(crate) async fn granting<T>(
        &self,
        context: &'static str,
        key: &fencelock_core::LockKey,
        op: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        bounded(self.url.op_timeout, op).await.map_err(|e| {
            if crate::error::sequence_ended(&e) {
                fencelock_core::Error::TokensExhausted { key: key.clone() }
            } else {
                map(context, e)
            }
        })
    }

    /// Opens the pool and the schema within the connect time-out;
    /// `relaxed` applies `synchronous_commit = off` to its sessions.
    pub(crate) async fn open(&self, relaxed: bool) -> Result<ConnectionPool<Postgres>> {
        let (names, limit) = (self.names(), self.url.connect_timeout);
        self.url
            .open(
                self.connect_options(relaxed)?,
                5432,
                crate::error::is_transient,
                map,
                move |conn| Box::pin(async move { schema::ensure(conn, &names, limit).await }),
            )
            .await
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
    pub(crate) fn listener_pool(&self) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.url.connect_timeout)
            .connect_lazy_with(self.connect_options(false)?))
    }
}
