//! The ZooKeeper session a backend or fence talks through, replaced when
//! the server expires it.

use std::{fmt, future::Future};

use fencelock_core::Result;
use futures_util::future::{try_join_all, BoxFuture, FutureExt, Shared};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use zookeeper_client as zk;

use crate::{
    error::{bounded, map},
    options::ZkOptions,
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
type Reconnect = Shared<BoxFuture<'static, std::result::Result<zk::Client, (String, zk::Error)>>>;

/// One ZooKeeper client (session) and the options it was opened with.
pub(crate) struct Conn {
    pub(crate) options: ZkOptions,
    session: std::sync::Mutex<Session>,
}

/// The live session, and the one replacing it once it expired.
struct Session {
    client: zk::Client,
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

/// Opens a session and makes sure the store's directories and its clock
/// node (written to read the leader's clock) exist.
async fn connect(options: &ZkOptions) -> std::result::Result<zk::Client, (String, zk::Error)> {
    let client = bounded(
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
            .connect(&options.connect_string()),
    )
    .await
    .map_err(|e| ("connecting to ZooKeeper".to_owned(), e))?;
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
    Ok(client)
}

/// Locks the session state: a plain swap of values, consistent even if a
/// holder panicked.
fn lock(session: &std::sync::Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    session
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Conn {
    /// Connects with `options`.
    pub(crate) async fn open(options: ZkOptions) -> Result<Self> {
        let client = connect(&options)
            .await
            .map_err(|(context, e)| map(&context, e))?;
        Ok(Self {
            options,
            session: std::sync::Mutex::new(Session {
                client,
                reconnect: None,
            }),
        })
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
                Some(Ok(client)) => !client.state().is_terminated(),
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
        let client = pending
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
