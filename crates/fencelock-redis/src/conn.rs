//! The command connection, every command bounded by the `timeout` option.
//!
//! The connection manager's response timeout covers a command on a live
//! connection, but a command issued while the manager reconnects waits for
//! the reconnection, which retries with backoff and can take several
//! timeouts. Bounding each request here keeps every operation, whatever the
//! manager is doing, within the timeout.

use std::{io, time::Duration};

use futures_util::FutureExt;
use redis::{
    aio::{ConnectionLike, ConnectionManager},
    Cmd, Pipeline, RedisFuture, Value,
};

/// A [`ConnectionManager`] whose requests fail with a timeout error (a
/// transient one, see `crate::error::map`) after `timeout`. Cheap to clone.
#[derive(Clone)]
pub struct BoundedConnection {
    conn: ConnectionManager,
    timeout: Duration,
}

impl BoundedConnection {
    /// Bounds every request of `conn` by `timeout`.
    pub fn new(conn: ConnectionManager, timeout: Duration) -> Self {
        Self { conn, timeout }
    }

    /// The same connection, its requests allowed `extra` time on top: for a
    /// command that waits on the server by design (`WAIT`).
    pub(crate) fn allowing(&self, extra: Duration) -> Self {
        Self {
            conn: self.conn.clone(),
            timeout: self.timeout.saturating_add(extra),
        }
    }
}

/// The error of a request that did not answer within `timeout`.
pub(crate) fn timed_out(timeout: Duration) -> redis::RedisError {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("redis did not answer within {timeout:?}"),
    )
    .into()
}

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.conn.req_packed_command(cmd))
            .map(move |r| r.unwrap_or_else(|_| Err(timed_out(timeout))))
            .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.conn.req_packed_commands(cmd, offset, count))
            .map(move |r| r.unwrap_or_else(|_| Err(timed_out(timeout))))
            .boxed()
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}
