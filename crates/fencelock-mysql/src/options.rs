//! [`MySqlOptions`]: what a URL configures, and opening pools with it.

use std::{future::Future, str::FromStr};

use fencelock_core::Result;
use fencelock_sql_common::{bounded, ConnectionPool, SqlUrl};
use sqlx::{mysql::MySqlConnectOptions, MySql};

use crate::{
    error::map,
    schema::{self, Names},
};

/// URL schemes this crate accepts; the first is what the driver is given.
pub(crate) const SCHEMES: &[&str] = &["mysql", "mariadb"];

/// How the backend was configured.
#[derive(Clone, Debug)]
pub struct MySqlOptions {
    pub(crate) url: SqlUrl,
}

impl MySqlOptions {
    /// Parses a `mysql://` or `mariadb://` URL. Besides the driver's own
    /// parameters (`ssl-mode`, …) it accepts `table_prefix` (default
    /// `fencelock_`), `pool_max` (default 10), `acquire_timeout` (default
    /// `10s`), and `connect_timeout` and `op_timeout` (default `5s` each).
    pub fn from_url(url: &str) -> Result<Self> {
        Ok(Self {
            url: fencelock_sql_common::parse(url, SCHEMES, &[])?,
        })
    }

    /// The table prefix in use.
    pub fn table_prefix(&self) -> &str {
        &self.url.prefix
    }

    pub(crate) fn names(&self) -> Names {
        Names::new(&self.url.prefix)
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

    /// [`Self::bounded`] for a statement that draws tokens for `key` (see
    /// [`crate::error::map_grant`]).
    pub(crate) async fn granting<T>(
        &self,
        context: &'static str,
        key: &fencelock_core::LockKey,
        op: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        bounded(self.url.op_timeout, op)
            .await
            .map_err(|e| crate::error::map_grant(context, key, e))
    }

    /// Opens the pool and the schema within the connect time-out.
    pub(crate) async fn open(&self) -> Result<ConnectionPool<MySql>> {
        let names = self.names();
        self.url
            .open(
                self.connect_options()?,
                3306,
                crate::error::is_transient,
                map,
                move |conn| Box::pin(async move { schema::ensure(conn, &names).await }),
            )
            .await
    }

    /// How every session connects.
    pub(crate) fn connect_options(&self) -> Result<MySqlConnectOptions> {
        // Leases are DATETIME(6) values compared with NOW(6), both in the
        // session's time zone, so every session must use the same one. UTC
        // is forced whatever the URL says (`?timezone=` would otherwise let
        // one client's leases look expired, or an hour longer, to others;
        // `SYSTEM` would step back an hour at the end of daylight saving).
        Ok(MySqlConnectOptions::from_str(self.url.driver_url.as_str())
            .map_err(|e| fencelock_sql_common::invalid_url(&self.url.driver_url, e))?
            .timezone(Some(String::from("+00:00"))))
    }
}
