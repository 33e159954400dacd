//! The raw baseline of `fencelock bench --baseline`: the backend's own
//! acquire and release statements, with its binds, prepared on one plain
//! `PgConnection` per benchmark client (same connect options as the
//! backend's pool, `synchronous_commit` included), without pool, listener or
//! library. Not a stable API.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    baseline::{RawBaseline, RawCycle, RAW_OWNER},
    Result,
};
use fencelock_sql_common::ttl_micros;
use sqlx::{postgres::PgConnectOptions, ConnectOptions, PgConnection, Row};

use crate::{backend::Sql, error::map, options::PostgresOptions};

/// Opens raw connections configured as the backend for the same URL.
pub struct PostgresBaseline {
    connect: PgConnectOptions,
    acquire: String,
    release: String,
}

/// Reads `url` as the backend does and makes sure the schema exists.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let options = PostgresOptions::from_url(url)?;
    let relaxed = options.synchronous_commit_off();
    let names = options.names();
    drop(options.open(relaxed).await?);
    let sql = Sql::new(&names);
    Ok(Box::new(PostgresBaseline {
        connect: options.connect_options(relaxed)?,
        acquire: sql.acquire,
        release: sql.release,
    }))
}

#[async_trait]
impl RawBaseline for PostgresBaseline {
    fn describe(&self) -> String {
        "the backend's acquire and release statements, prepared, on one PgConnection per client"
            .into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            conn: self
                .connect
                .connect()
                .await
                .map_err(|e| map("connecting", e))?,
            acquire: self.acquire.clone(),
            release: self.release.clone(),
        }))
    }
}

struct Worker {
    conn: PgConnection,
    acquire: String,
    release: String,
}

#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let row = sqlx::query(&self.acquire)
            .bind(key)
            .bind(RAW_OWNER)
            .bind(None::<&str>)
            .bind(None::<String>)
            .bind(ttl_micros(ttl))
            .fetch_optional(&mut self.conn)
            .await
            .map_err(|e| map("acquiring", e))?;
        let Some(row) = row else { return Ok(None) };
        if !row
            .try_get::<bool, _>("won")
            .map_err(|e| map("acquiring", e))?
        {
            return Ok(None);
        }
        let token: i64 = row.try_get("token").map_err(|e| map("acquiring", e))?;
        Ok(u64::try_from(token).ok())
    }

    async fn release(&mut self, key: &str, token: u64) -> Result<bool> {
        let Ok(token) = i64::try_from(token) else {
            return Ok(false);
        };
        let rows = sqlx::query(&self.release)
            .bind(key)
            .bind(RAW_OWNER)
            .bind(token)
            .fetch_all(&mut self.conn)
            .await
            .map_err(|e| map("releasing", e))?;
        Ok(!rows.is_empty())
    }
}
