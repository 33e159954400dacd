//! The connections a [`crate::Server`] keeps, and their bounds
//! (`docs/http.md`, "Connections and their limits").
//!
//! Each connection knows whether a request of it is in flight (from the
//! moment its head is parsed until its answer's body has been sent, so a
//! long poll or an event stream counts as busy however quiet it is), when
//! it last became idle, and when the first byte of its next request
//! arrived. From that its task knows when to close it: never while busy;
//! a new connection that has not sent a whole request head within the
//! header-read timeout of its opening (its TLS handshake included); a
//! kept-alive one that sits idle longer than the idle timeout, or whose
//! next head takes longer than the header-read timeout from its first
//! byte.
//!
//! The registry caps how many are open. A connection over the cap makes
//! room by closing the one that has been idle longest (an idle connection
//! costs its client nothing to open again, and a flood of idle or
//! half-sent sockets can then never keep a health check out). When every
//! connection is busy (long polls and event streams can fill the cap), the
//! new one takes one of a few spares kept beyond the cap: a spare answers
//! `/healthz` as usual and anything else with 503 and `retry_after_ms`,
//! then closes, so that a balancer's check still tells a busy replica from
//! a dead one, and a client is told to come back rather than cut off. When
//! the spares are taken too, the new connection is closed at once.

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

/// The timeouts a connection is held to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) header_read: Duration,
    pub(crate) idle: Duration,
}

/// Connections kept beyond the cap for the spares (see the module docs):
/// each is answered at once and closed, so a few are enough.
pub(crate) const SPARE_CONNECTIONS: usize = 16;

/// The open connections.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Spare connections open now.
    spares: AtomicUsize,
}

impl Registry {
    fn live(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection, closing the longest idle one when `max`
    /// are open already; when every open connection is busy, a spare
    /// ([`Conn::spare`]) if one of [`SPARE_CONNECTIONS`] is free, else
    /// `None`.
    pub(crate) fn open(&self, max: usize) -> Option<Arc<Conn>> {
        let mut live = self.live();
        if live.len() >= max.max(1) {
            let victim = live
                .values()
                .filter_map(|c| c.idle_since().map(|since| (since, c.id)))
                .min()
                .map(|(_, id)| id);
            match victim.and_then(|victim| live.remove(&victim)) {
                Some(victim) => victim.evicted.cancel(),
                None => {
                    drop(live);
                    return self.open_spare();
                }
            }
        }
        let conn = self.conn(false);
        live.insert(conn.id, Arc::clone(&conn));
        Some(conn)
    }

    /// A spare connection, counted apart from the cap's.
    fn open_spare(&self) -> Option<Arc<Conn>> {
        self.spares
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < SPARE_CONNECTIONS).then_some(n + 1)
            })
            .ok()?;
        Some(self.conn(true))
    }

    fn conn(&self, spare: bool) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        Arc::new(Conn {
            id,
            spare,
            state: Mutex::new(State {
                in_flight: 0,
                served: 0,
                idle_since: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
            evicted: CancellationToken::new(),
        })
    }

    /// Forgets a connection that ended.
    pub(crate) fn close(&self, conn: &Conn) {
        if conn.spare {
            self.spares.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.live().remove(&conn.id);
        }
    }

    /// How many connections are open.
    pub(crate) fn len(&self) -> usize {
        self.live().len()
    }
}

/// One connection's state.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) id: u64,
    /// Opened beyond the cap while every connection was busy: answers
    /// `/healthz`, refuses the rest with 503, and closes after one answer.
    pub(crate) spare: bool,
    state: Mutex<State>,
    /// Told when a request starts or ends, or a head starts arriving: the
    /// connection's deadline moved.
    pub(crate) changed: Notify,
    /// Cancelled when the registry closed this connection to make room.
    pub(crate) evicted: CancellationToken,
}

#[derive(Debug)]
struct State {
    /// Requests whose answer has not been sent whole.
    in_flight: usize,
    /// Requests served so far.
    served: u64,
    /// When the connection opened or its last answer ended.
    idle_since: Instant,
    /// When the first byte of the next request arrived while idle.
    head_started: Option<Instant>,
}

impl Conn {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Since when the connection is idle; `None` while busy.
    fn idle_since(&self) -> Option<Instant> {
        let s = self.state();
        (s.in_flight == 0).then_some(s.idle_since)
    }

    /// When the connection is to be closed if nothing changes; `None`
    /// while a request is in flight.
    pub(crate) fn deadline(&self, t: Timeouts) -> Option<Instant> {
        let s = self.state();
        if s.in_flight > 0 {
            return None;
        }
        Some(match (s.served, s.head_started) {
            // A new connection owes its first head from its opening.
            (0, _) => s.idle_since + t.header_read,
            (_, Some(started)) => started + t.header_read,
            (_, None) => s.idle_since + t.idle,
        })
    }

    /// A request's head was parsed: busy until the guard is dropped with
    /// the answer's body.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        {
            let mut s = self.state();
            s.in_flight += 1;
            s.served += 1;
            s.head_started = None;
        }
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }

    /// Bytes arrived.
    fn read_some(&self) {
        let mut s = self.state();
        if s.in_flight == 0 && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }
}

/// A request in flight on its connection.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut s = self.0.state();
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.in_flight == 0 {
                s.idle_since = Instant::now();
                s.head_started = None;
            }
        }
        self.0.changed.notify_one();
    }
}

/// An answer's body that keeps its connection busy until it is sent whole
/// (or dropped, when the client goes away).
pub(crate) struct Tracked {
    pub(crate) inner: Body,
    pub(crate) _busy: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket (under TLS, when served so), telling its [`Conn`]
/// when a request starts arriving.
pub(crate) struct Watched<S> {
    pub(crate) inner: S,
    pub(crate) conn: Arc<Conn>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.read_some();
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_registry_closes_the_longest_idle_connection_never_a_busy_one() {
        let registry = Registry::default();
        let busy = registry.open(2).unwrap();
        let _request = busy.begin();
        let idle = registry.open(2).unwrap();
        let newer = registry.open(2).unwrap();
        assert!(idle.evicted.is_cancelled());
        assert!(!busy.evicted.is_cancelled());
        assert_eq!(registry.len(), 2);
        // Both left are busy: spares, then no room.
        let _second = newer.begin();
        let spares: Vec<_> = (0..SPARE_CONNECTIONS)
            .map(|_| registry.open(2).unwrap())
            .collect();
        assert!(spares.iter().all(|c| c.spare));
        assert!(registry.open(2).is_none());
        // A spare that ends makes room for another; the cap's count is
        // untouched by spares.
        registry.close(&spares[0]);
        assert!(registry.open(2).unwrap().spare);
        assert_eq!(registry.len(), 2);
    }

    #[tokio::test]
    async fn deadlines_follow_the_connections_state() {
        let t = Timeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        };
        let registry = Registry::default();
        let conn = registry.open(10).unwrap();
        let opened = conn.idle_since().unwrap();
        assert_eq!(conn.deadline(t), Some(opened + t.header_read));
        let request = conn.begin();
        assert_eq!(conn.deadline(t), None);
        drop(request);
        let idle = conn.idle_since().unwrap();
        assert_eq!(conn.deadline(t), Some(idle + t.idle));
        conn.read_some();
        let started = conn.state().head_started.unwrap();
        assert_eq!(conn.deadline(t), Some(started + t.header_read));
    }
}
