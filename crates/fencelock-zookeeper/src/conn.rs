//! The ZooKeeper session a backend or fence talks through, replaced when
//! the server expires it.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use fencelock_core::Result;
use futures_util::future::{try_join_all, BoxFuture, FutureExt, Shared};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use zookeeper_client as zk;

use crate::{
    error::{bounded, map},
    options::{ZkBalance, ZkOptions},
};

/// Characters a lock key or resource name keeps as they are in a node name;
/// `%` escapes the rest, so `/` and the characters ZooKeeper refuses in
/// paths never reach it.
const KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b':');

/// The node name of a key: `k` and the escaped key, so that no key becomes
/// `.` or `..`.
pub(crate) fn encode(name: &str) -> String {
    format!("k{}", utf8_percent_encode(name, KEEP))
}

/// The key a node name encodes, or `None` for a node this crate did not
/// name.
pub(crate) fn decode(node: &str) -> Option<String> {
    let escaped = node.strip_prefix('k')?;
    percent_decode_str(escaped)
        .decode_utf8()
        .ok()
        .map(|k| k.into_owned())
}

/// A reconnection under way: its outcome, shared by every caller waiting
/// for it, with the context of a failure.
type Reconnect = Shared<
    BoxFuture<'static, std::result::Result<(zk::Client, Option<usize>), (String, zk::Error)>>,
>;

/// One ZooKeeper client (session) and the options it was opened with.
pub(crate) struct Conn {
    pub(crate) options: ZkOptions,
    /// Shared with the steward of `balance=first` (`steward`), which holds
    /// it weakly and ends once the connection is dropped.
    session: Arc<std::sync::Mutex<Session>>,
}

/// The live session, and the one replacing it once it expired.
struct Session {
    client: zk::Client,
    /// With `balance=first`, the server (index in the URL) the client
    /// is on; `None` with `balance=all`, where the library picks.
    on: Option<usize>,
    /// Runs in a task of its own, so a caller that stops waiting (its
    /// deadline passed, or it was dropped) does not cancel it. Run inside
    /// each caller instead, a reconnection was abandoned with every caller
    /// that gave up sooner than a new session takes to form; after a site
    /// partition healed, impatient callers (one every few tens of
    /// milliseconds) kept a backend without a session for minutes while
    /// every member answered (`docs/multi-dc.md`).
    reconnect: Option<Reconnect>,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How often the steward of `balance=first` looks at its session.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Probes in a row a session must find its server lost before it moves,
/// so that a blip the library reconnects through by itself moves nothing.
const LOST_AFTER: u32 = 2;

/// While on a later server than the first, how many probes pass between
/// tries of the earlier ones (each try that succeeds opens a session,
/// a write through the leader).
const BACK_EVERY: u32 = 4;

/// Opens a session on `servers` (a connect string), the library picking
/// among them.
async fn session_on(
    options: &ZkOptions,
    servers: &str,
) -> std::result::Result<zk::Client, (String, zk::Error)> {
    bounded(
        options.timeout,
        // Eagerly: once every listed server has been tried, fail (with a
        // transient error that waiting callers retry) instead of cycling
        // through them again until the time-out, which took 5 s to report
        // a port nobody listens on. A server that accepts and stays silent
        // is still given the whole connection time-out. Only the first
        // connect: the session's later reconnections cycle as before.
        zk::Client::connector()
            .with_session_timeout(options.session_timeout)
            .with_connection_timeout(options.timeout)
            .with_fail_eagerly()
            .connect(servers),
    )
    .await
    .map_err(|e| ("connecting to ZooKeeper".to_owned(), e))
}

/// A session on the first of the servers at `order` (indices in the URL)
/// that accepts one, and which it is.
async fn session_in_order(
    options: &ZkOptions,
    order: impl IntoIterator<Item = usize>,
) -> std::result::Result<(zk::Client, usize), (String, zk::Error)> {
    let mut last = None;
    for i in order {
        let Some(server) = options.servers.get(i) else {
            continue;
        };
        match session_on(options, server).await {
            Ok(client) => return Ok((client, i)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        (
            "connecting to ZooKeeper".to_owned(),
            zk::Error::UnexpectedError("no server to connect to".into()),
        )
    }))
}

/// Opens a session (on the first server that accepts one, in order, with
/// `balance=first`) and makes sure the store's directories and its clock
/// node (written to read the leader's clock) exist.
async fn connect(
    options: &ZkOptions,
) -> std::result::Result<(zk::Client, Option<usize>), (String, zk::Error)> {
    let (client, on) = match options.balance {
        ZkBalance::First => session_in_order(options, 0..options.servers.len())
            .await
            .map(|(client, i)| (client, Some(i)))?,
        _ => (session_on(options, &options.connect_string()).await?, None),
    };
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    // `leases` holds the lease records of `layout=curator` contenders,
    // whose own nodes are ephemeral and can have no child (`backend.rs`).
    let subs: &[&str] = match options.layout {
        crate::options::ZkLayout::Curator => &["locks", "fences", "clock", "leases"],
        _ => &["locks", "fences", "clock"],
    };
    // All at once: each is a write through the leader even when the
    // directory exists, and a new session after a partition should cost
    // one round trip to it, not one per directory.
    let paths: Vec<String> = subs
        .iter()
        .map(|sub| format!("{}/{sub}", options.base()))
        .collect();
    let (made, dir) = (&client, &dir);
    try_join_all(paths.iter().map(|path| async move {
        bounded(options.timeout, made.mkdir(path, dir))
            .await
            .map_err(|e| (format!("creating {path}"), e))
    }))
    .await?;
    Ok((client, on))
}

/// Keeps a `balance=first` session on the first server, in the URL's
/// order, that accepts one; runs until the connection is dropped.
///
/// The client library, given one server, reconnects to it alone until the
/// session expires: seconds after the server died, with every request
/// failing meanwhile, and a lease outlives a session only by renewals that
/// go through. So the steward looks at the session every [`PROBE_EVERY`]:
///
/// - lost ([`LOST_AFTER`] probes in a row without a connection): a new
///   session on the first of the others, in order, that accepts one, or
///   else on the lost one (a silent server costs a try the whole
///   time-out, so it comes last);
/// - on a later server than the first: every [`BACK_EVERY`] probes, a new
///   session on an earlier one, if one accepts it.
///
/// The new session replaces the old one for every later request, which the
/// library then closes once nothing holds it; requests on the old one fail
/// or finish, and callers try again on the new one. Nothing in
/// fencelock's own layout belongs to a session (`docs/zookeeper.md`), so
/// no lease is lost by a move; an expired session is not the steward's:
/// the next caller replaces it ([`Conn::client`]).
async fn steward(session: Weak<std::sync::Mutex<Session>>, options: ZkOptions) {
    let (mut lost_for, mut probes) = (0u32, 0u32);
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let (client, on) = {
            let Some(shared) = session.upgrade() else {
                return;
            };
            let guard = lock(&shared);
            if guard.reconnect.is_some() {
                continue;
            }
            (guard.client.clone(), guard.on.unwrap_or(0))
        };
        probes = probes.wrapping_add(1);
        let state = client.state();
        lost_for = match state {
            zk::SessionState::Disconnected => lost_for + 1,
            _ => 0,
        };
        let moved = if state.is_terminated() {
            continue;
        } else if lost_for >= LOST_AFTER {
            let others = (0..options.servers.len()).filter(|&i| i != on);
            session_in_order(&options, others.chain([on])).await.ok()
        } else if on > 0 && probes % BACK_EVERY == 0 {
            session_in_order(&options, 0..on).await.ok()
        } else {
            continue;
        };
        let Some((fresh, to)) = moved else {
            continue;
        };
        let Some(shared) = session.upgrade() else {
            return;
        };
        let mut guard = lock(&shared);
        // Unless the session was replaced meanwhile (expired, and renewed
        // by a caller): then the fresh one is dropped, and closed.
        if guard.reconnect.is_none() && guard.client.session_id() == client.session_id() {
            tracing::info!(
                from = %options.servers[on],
                to = %options.servers[to],
                "ZooKeeper: the session moves to another server (balance=first)"
            );
            guard.client = fresh;
            guard.on = Some(to);
            lost_for = 0;
        }
    }
}

/// Locks the session state: a plain swap of values, consistent even if a
/// holder panicked.
fn lock(session: &std::sync::Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    session
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Conn {
    /// Connects with `options`; with `balance=first`, starts the steward
    /// that moves the session between servers.
    pub(crate) async fn open(options: ZkOptions) -> Result<Self> {
        let (client, on) = connect(&options)
            .await
            .map_err(|(context, e)| map(&context, e))?;
        let session = Arc::new(std::sync::Mutex::new(Session {
            client,
            on,
            reconnect: None,
        }));
        if options.balance == ZkBalance::First {
            tokio::spawn(steward(Arc::downgrade(&session), options.clone()));
        }
        Ok(Self { options, session })
    }

    /// The session of the live client (which a caller of
    /// [`Conn::client`] gets), as it stands now.
    pub(crate) fn session_id(&self) -> zk::SessionId {
        lock(&self.session).client.session_id()
    }

    /// The live client. An expired session never comes back, so the first
    /// call after expiry starts a new one, which the calls after it share
    /// until it has formed or failed. In the default layout nothing
    /// fencelock stores belongs to a session (`docs/zookeeper.md`), so no
    /// lease is lost by it; in `layout=curator` the contender nodes of the
    /// expired session are gone, and so are their leases.
    pub(crate) async fn client(&self) -> Result<zk::Client> {
        let pending = {
            let mut session = lock(&self.session);
            if !session.client.state().is_terminated() {
                return Ok(session.client.clone());
            }
            let usable = |r: &Reconnect| match r.peek() {
                None => true,
                Some(Ok((client, _))) => !client.state().is_terminated(),
                Some(Err(_)) => false,
            };
            match &session.reconnect {
                Some(r) if usable(r) => r.clone(),
                _ => {
                    let options = self.options.clone();
                    let task = tokio::spawn(async move { connect(&options).await });
                    let r: Reconnect = async move {
                        task.await.unwrap_or_else(|e| {
                            Err((
                                "connecting to ZooKeeper".to_owned(),
                                zk::Error::UnexpectedError(e.to_string()),
                            ))
                        })
                    }
                    .boxed()
                    .shared();
                    session.reconnect = Some(r.clone());
                    r
                }
            }
        };
        let (client, on) = pending
            .clone()
            .await
            .map_err(|(context, e)| map(&context, e))?;
        let mut session = lock(&self.session);
        if session
            .reconnect
            .as_ref()
            .is_some_and(|r| r.ptr_eq(&pending))
        {
            session.client = client.clone();
            session.on = on;
            session.reconnect = None;
        }
        Ok(client)
    }

    /// Runs one request, bounded by the `timeout` option, with its error
    /// classified under `context`.
    pub(crate) async fn call<T, Fut>(&self, context: &str, fut: Fut) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        bounded(self.options.timeout, fut)
            .await
            .map_err(|e| map(context, e))
    }

    /// Runs one request bounded by the `timeout` option, leaving its error
    /// for the caller to inspect.
    pub(crate) async fn raw<T, Fut>(&self, fut: Fut) -> std::result::Result<T, zk::Error>
    where
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        bounded(self.options.timeout, fut).await
    }

    /// Like [`Conn::call`], but `NoNode` is `None`.
    pub(crate) async fn maybe<T, Fut>(&self, context: &str, fut: Fut) -> Result<Option<T>>
    where
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        match bounded(self.options.timeout, fut).await {
            Ok(v) => Ok(Some(v)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(context, e)),
        }
    }

    /// The directory of the locks.
    pub(crate) fn locks_dir(&self) -> String {
        format!("{}/locks", self.options.base())
    }

    /// The directory of the lease records of `layout=curator` contenders.
    pub(crate) fn leases_dir(&self) -> String {
        format!("{}/leases", self.options.base())
    }

    /// The directory of the fences.
    pub(crate) fn fences_dir(&self) -> String {
        format!("{}/fences", self.options.base())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_never_contain_a_slash() {
        for key in ["a", ".", "..", "a/b", "é ü", "100%", "k", "x\u{ffff}y"] {
            let node = encode(key);
            assert!(!node.contains('/') && node != "." && node != "..", "{node}");
            assert_eq!(decode(&node).as_deref(), Some(key));
        }
        assert_eq!(decode("clock"), None);
    }
}
