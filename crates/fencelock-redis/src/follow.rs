//! Following a failover as soon as the deployment announces it.
//!
//! Behind Sentinel and in a Redis Cluster, a failover replaces the server a
//! client sends its requests to, but nothing tells the client: a request to
//! a stopped server (one that accepts connections and never answers) waits
//! for its time-out, and the next one goes to the same place. Neither the
//! connection manager nor the cluster client looks elsewhere on its own: the
//! cluster client refreshes its slot map on a redirection, which a silent
//! node never sends. So a holder whose lease the promoted replica holds
//! loses it all the same, and a new caller waits until the old server
//! resumes.
//!
//! A [`Follower`] keeps the connection of the moment and, when a request
//! fails as a failover makes requests fail, or stays without an answer for
//! [`SILENT_AFTER`], starts one search in the background: it asks the
//! deployment ([`Source::ask`]) every [`ASK_EVERY`] until it names where
//! requests go, for at most [`SEARCH_FOR`]. While the deployment judges the
//! silent server (Sentinel's down-after and election, a cluster's node
//! time-out and replica election) it keeps naming it; once it names another,
//! later requests go there, and the requests still waiting on the old one
//! fail at once as transient errors ([`Moved`]) so their callers retry on
//! the new one instead of a time-out later.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use redis::{ErrorKind, RedisError, RedisResult};
use tokio::time::Instant;

/// A request without an answer this long starts a search: Redis answers in
/// well under a millisecond.
pub(crate) const SILENT_AFTER: Duration = Duration::from_millis(250);
/// How often a search asks again.
pub(crate) const ASK_EVERY: Duration = Duration::from_millis(100);
/// Bound on one question to one server: a stopped server accepts
/// connections and never answers.
pub(crate) const ASK_WITHIN: Duration = Duration::from_millis(500);
/// A search that finds nothing for this long ends; the next request that
/// fails or stalls starts another.
const SEARCH_FOR: Duration = Duration::from_secs(60);

/// Where a [`Follower`] learns where requests go.
pub(crate) trait Source: Send + Sync + 'static {
    /// The connection requests are sent on.
    type Conn: Clone + Send + Sync + 'static;

    /// What is followed, for the log.
    fn what(&self) -> String;

    /// Asks the deployment where requests go now: `None` when `current`
    /// is still right, a new connection when it names another server, an
    /// error while it cannot tell (no answer, or the server it names does
    /// not answer yet).
    fn ask(
        &self,
        current: &Self::Conn,
    ) -> impl Future<Output = RedisResult<Option<Self::Conn>>> + Send;
}

/// See the module docs.
pub(crate) struct Follower<S: Source> {
    source: S,
    current: Mutex<S::Conn>,
    /// Counts the connections followed; a request waiting on the one
    /// before sees it change.
    moves: tokio::sync::watch::Sender<u64>,
    /// A search is under way: the errors of the requests in flight to the
    /// old server start no other.
    searching: AtomicBool,
}

impl<S: Source> Follower<S> {
    /// Follows `source`, starting with `conn`.
    pub(crate) fn new(source: S, conn: S::Conn) -> Arc<Self> {
        Arc::new(Self {
            source,
            current: Mutex::new(conn),
            moves: tokio::sync::watch::Sender::new(0),
            searching: AtomicBool::new(false),
        })
    }

    /// The connection as last found.
    pub(crate) fn current(&self) -> S::Conn {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// [`Follower::current`], and what ends a request sent on it once
    /// another connection is followed.
    pub(crate) fn watched(&self) -> (S::Conn, Moved) {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        (current.clone(), Moved(self.moves.subscribe()))
    }

    /// Asks until the source names where requests go; follows it when it
    /// is not the connection in use.
    async fn search(&self) {
        let until = Instant::now() + SEARCH_FOR;
        loop {
            match self.source.ask(&self.current()).await {
                // Whatever made the request fail or stall, it was no
                // failover.
                Ok(None) => return,
                Ok(Some(conn)) => {
                    tracing::info!(what = %self.source.what(), "following a failover");
                    *self.current.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                    self.moves.send_modify(|n| *n += 1);
                    return;
                }
                Err(e) => {
                    tracing::debug!(what = %self.source.what(), error = %e, "no failover seen yet; asking again");
                }
            }
            if Instant::now() >= until {
                tracing::warn!(what = %self.source.what(), "nothing answers after {SEARCH_FOR:?}; asking again when a request fails");
                return;
            }
            tokio::time::sleep(ASK_EVERY).await;
        }
    }
}

/// What a request's bound tells a follower, whatever it follows.
pub(crate) trait Searches: Send + Sync {
    /// Starts a search in the background unless one is under way (bounded
    /// by the caller's runtime only; the requests themselves stay bounded
    /// by their time-out).
    fn search_soon(self: Arc<Self>);

    /// Looks at a request's failure: one that a failover causes starts a
    /// search.
    fn saw(self: Arc<Self>, e: &RedisError) {
        if after_failover(e) {
            self.search_soon();
        }
    }
}

impl<S: Source> Searches for Follower<S> {
    fn search_soon(self: Arc<Self>) {
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            self.search().await;
            self.searching.store(false, Ordering::Release);
        });
    }
}

/// Ends a request to a server that is no longer followed.
///
/// A request to a dead server waits for the reconnection attempts until its
/// time-out; once the deployment has named another there is nothing to wait
/// for. It fails then, as a transient error, and its caller retries on the
/// new server at once. (Whether the old server ran it is unknown, as after
/// any time-out.)
pub(crate) struct Moved(tokio::sync::watch::Receiver<u64>);

impl Moved {
    /// `request`, unless another connection is followed first.
    pub(crate) fn unless_moved<'a, T: Send + 'a>(
        mut self,
        request: impl Future<Output = RedisResult<T>> + Send + 'a,
    ) -> redis::RedisFuture<'a, T> {
        Box::pin(async move {
            tokio::select! {
                biased;
                answer = request => answer,
                Ok(()) = self.0.changed() => Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "a failover moved the server while the request waited for the old one",
                )
                .into()),
            }
        })
    }
}

/// `request` within `timeout`, bounded by `future` meanwhile; a request
/// still waiting after [`SILENT_AFTER`] starts a search.
///
/// One timer at a time: most requests answer before the first ends, and a
/// timer registered with tokio's time driver can wake the runtime's other
/// worker.
pub(crate) async fn watching<T>(
    follower: Arc<dyn Searches>,
    timeout: Duration,
    request: impl Future<Output = RedisResult<T>>,
) -> Option<RedisResult<T>> {
    tokio::pin!(request);
    let first = SILENT_AFTER.min(timeout);
    let answer = match tokio::time::timeout(first, &mut request).await {
        Ok(answer) => Some(answer),
        Err(_) => {
            Arc::clone(&follower).search_soon();
            tokio::time::timeout(timeout.saturating_sub(first), request)
                .await
                .ok()
        }
    };
    match &answer {
        Some(Err(e)) => follower.saw(e),
        Some(Ok(_)) => {}
        None => follower.search_soon(),
    }
    answer
}

/// Whether `e` is how a failover shows: the server unreachable or silent,
/// or turned replica.
fn after_failover(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::ClusterDown)
}
