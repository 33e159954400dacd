//! The raw baseline of `fencelock bench --baseline`: the backend's own
//! acquisition and release transactions (the same statements, in the same
//! `BEGIN IMMEDIATE` transactions, with the same clock reads) run directly on
//! one plain rusqlite connection per benchmark client, opened with the
//! backend's pragmas, on the calling thread: no blocking-pool hop, no shared
//! connection mutex, no library. Not a stable API.

use std::time::Duration;

use async_trait::async_trait;
use fencelock_core::{
    baseline::{granted_token, raw_request, RawBaseline, RawCycle, RAW_OWNER},
    Result,
};
use rusqlite::Connection;

use crate::{
    backend::{acquire_in, release_in, write_tx, Table},
    clock::HostClock,
    connection::open_blocking,
    options::SqliteOptions,
};

/// Opens raw connections to the file of a `sqlite://` URL.
pub struct SqliteBaseline {
    options: SqliteOptions,
    clock: HostClock,
}

/// Reads `url` as the backend does.
pub async fn open(url: &str) -> Result<Box<dyn RawBaseline>> {
    Ok(Box::new(SqliteBaseline {
        options: SqliteOptions::from_url(url)?,
        clock: HostClock::new()?,
    }))
}

#[async_trait]
impl RawBaseline for SqliteBaseline {
    fn describe(&self) -> String {
        "the backend's acquire and release transactions on one rusqlite connection per client, \
         on the calling thread"
            .into()
    }

    async fn worker(&self) -> Result<Box<dyn RawCycle>> {
        Ok(Box::new(Worker {
            conn: tokio::task::block_in_place(|| open_blocking(&self.options))?,
            clock: self.clock.clone(),
        }))
    }
}

struct Worker {
    conn: Connection,
    clock: HostClock,
}

// Each call blocks its thread for one transaction, as the backend's
// blocking-pool thread does; `block_in_place` tells the runtime so (it
// needs a multi-threaded runtime, which the CLI has).
#[async_trait]
impl RawCycle for Worker {
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<Option<u64>> {
        let request = raw_request(key, ttl)?;
        let acquired = tokio::task::block_in_place(|| {
            write_tx(&mut self.conn, &self.clock, |tx, now| {
                acquire_in(tx, now, &request)
            })
        })?;
        Ok(granted_token(acquired))
    }

    async fn release(&mut self, key: &str, token: u64) -> Result<bool> {
        let Ok(token) = i64::try_from(token) else {
            return Ok(false);
        };
        tokio::task::block_in_place(|| {
            write_tx(&mut self.conn, &self.clock, |tx, now| {
                release_in(tx, now, Table::Locks, key, RAW_OWNER, token)
            })
        })
    }
}
