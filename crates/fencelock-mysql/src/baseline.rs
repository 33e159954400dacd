//! The raw baseline of `fencelock bench --baseline`: the backend's
//! statements of a cycle (the key's `GET_LOCK` turn, the token draw, the
//! upsert, the result `SELECT` on the same session, the `DELETE`), with its binds,
//! prepared on one plain `MySqlConnection` per benchmark client (same
//! connect options as the backend's pool), without pool or library. Not a
//! stable API.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    baseline::{RawBaseline, RawCycle, RAW_OWNER},
    Result,
};
use sqlx::{mysql::MySqlConnectOptions, ConnectOptions, MySqlConnection, Row};

use crate::{backend::Sql, error::map, options::MySqlOptions};

/// Opens raw connections configured as the backend for the same URL.
pub struct MySqlBaseline {
    connect: MySqlConnectOptions,
    sql: std::sync::Arc<Sql>,
}

/// Reads `url` as the backend does and makes sure the schema exists.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    let options = MySqlOptions::from_url(url)?;
    let names = options.names();
    drop(options.open().await?);
    Ok(Box::new(MySqlBaseline {
        connect: options.connect_options()?,
        sql: std::sync::Arc::new(Sql::new(&names)),
    }))
}

#[async_trait]
impl RawBaseline for MySqlBaseline {
    fn describe(&self) -> String {
        "the backend's turn-and-draw request, upsert, result SELECT and DELETE (prepared but \
         the first), on one MySqlConnection per client"
            .into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            conn: self
                .connect
                .connect()
                .await
                .map_err(|e| map("connecting", e))?,
            sql: std::sync::Arc::clone(&self.sql),
        }))
    }
}

struct Worker {
    conn: MySqlConnection,
    sql: std::sync::Arc<Sql>,
}

#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let fail = |e| map("acquiring", e);
        crate::backend::upsert(
            &mut self.conn,
            &self.sql,
            key,
            RAW_OWNER,
            None,
            None,
            ttl,
            0,
        )
        .await
        .map_err(fail)?;
        let row = sqlx::query(&self.sql.acquire_result)
            .bind(key)
            .bind(key)
            .fetch_one(&mut self.conn)
            .await
            .map_err(fail)?;
        if row.try_get::<Option<bool>, _>("won").map_err(fail)? != Some(true) {
            return Ok(None);
        }
        Ok(Some(row.try_get("token").map_err(fail)?))
    }

    async fn release(&mut self, key: &str, token: u64) -> Result<bool> {
        let deleted = sqlx::query(&self.sql.release)
            .bind(key)
            .bind(RAW_OWNER)
            .bind(token)
            .execute(&mut self.conn)
            .await
            .map_err(|e| map("releasing", e))?
            .rows_affected();
        Ok(deleted > 0)
    }
}
