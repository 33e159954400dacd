//! The ZooKeeper session a backend or fence talks through, replaced when
//! the server expires it.

use std::{fmt, future::Future};

use fencelock_core::Result;
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

/// One ZooKeeper client (session) and the options it was opened with.
pub(crate) struct Conn {
    pub(crate) options: ZkOptions,
    client: tokio::sync::Mutex<zk::Client>,
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
async fn connect(options: &ZkOptions) -> Result<zk::Client> {
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
    .map_err(|e| map("connecting to ZooKeeper", e))?;
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    // `leases` holds the lease records of `layout=curator` contenders,
    // whose own nodes are ephemeral and can have no child (`backend.rs`).
    let subs: &[&str] = match options.layout {
        crate::options::ZkLayout::Curator => &["locks", "fences", "clock", "leases"],
        _ => &["locks", "fences", "clock"],
    };
    for sub in subs {
        let path = format!("{}/{sub}", options.base());
        bounded(options.timeout, client.mkdir(&path, &dir))
            .await
            .map_err(|e| map(&format!("creating {path}"), e))?;
    }
    Ok(client)
}

impl Conn {
    /// Connects with `options`.
    pub(crate) async fn open(options: ZkOptions) -> Result<Self> {
        let client = connect(&options).await?;
        Ok(Self {
            options,
            client: tokio::sync::Mutex::new(client),
        })
    }

    /// The live client. An expired session never comes back, so the first
    /// call after expiry opens a new one. In the default layout nothing
    /// fencelock stores belongs to a session (`docs/zookeeper.md`), so no
    /// lease is lost by it; in `layout=curator` the contender nodes of the
    /// expired session are gone, and so are their leases.
    pub(crate) async fn client(&self) -> Result<zk::Client> {
        let mut client = self.client.lock().await;
        if client.state().is_terminated() {
            *client = connect(&self.options).await?;
        }
        Ok(client.clone())
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
