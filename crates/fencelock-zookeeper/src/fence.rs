//! [`ZkFence`]: the I7 fence as a compare-and-set on a node's version.

use std::{fmt, sync::Arc};

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FenceRecord, FencingToken, LockMode, Result};
use zookeeper_client as zk;

use crate::{
    conn::{encode, Conn},
    error::{bad_value, map},
    options::ZkOptions,
};

/// A fence in ZooKeeper: one node per resource (`BASE/fences/RESOURCE`)
/// holding the highest admitted token in decimal, followed by `/W` when
/// the highest admitted writer token `W` is lower (read-write locks,
/// `docs/rwlock.md`; a bare number, as every node from before, is a
/// writer's). Admission reads the node and raises it with a write
/// conditional on the version it read, retrying on a concurrent change.
#[derive(Clone)]
pub struct ZkFence {
    conn: Arc<Conn>,
}

impl fmt::Debug for ZkFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkFence")
            .field("options", &self.conn.options)
            .finish()
    }
}

impl ZkFence {
    /// Connects with `options`.
    pub async fn connect_with(options: ZkOptions) -> Result<Self> {
        Ok(Self {
            conn: Arc::new(Conn::open(options).await?),
        })
    }

    /// Connects to `url` (see [`ZkOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(ZkOptions::from_url(url)?).await
    }

    fn path(&self, resource: &str) -> String {
        format!("{}/{}", self.conn.fences_dir(), encode(resource))
    }

    /// The record and the node's version, if any.
    async fn read(&self, c: &zk::Client, path: &str) -> Result<Option<(FenceRecord, i32)>> {
        let Some((bytes, stat)) = self.conn.maybe("reading a fence", c.get_data(path)).await?
        else {
            return Ok(None);
        };
        let record = std::str::from_utf8(&bytes)
            .ok()
            .and_then(FenceRecord::parse)
            .ok_or_else(|| bad_value(format!("{path} holds no token")))?;
        Ok(Some((record, stat.version)))
    }

    async fn record(&self, resource: &str) -> Result<Option<FenceRecord>> {
        let c = self.conn.client().await?;
        Ok(self.read(&c, &self.path(resource)).await?.map(|(r, _)| r))
    }
}

#[async_trait]
impl Fence for ZkFence {
    fn name(&self) -> &'static str {
        crate::error::NAME
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let c = self.conn.client().await?;
        let path = self.path(resource);
        loop {
            let current = self.read(&c, &path).await?;
            let next = match FenceRecord::admit(current.map(|(r, _)| r), token, mode) {
                Ok(next) => next,
                Err(floor) => return Ok(Admission::Stale { current: floor }),
            };
            let value = next.to_string();
            let written = match current {
                Some((record, _)) if record == next => return Ok(Admission::Admitted),
                Some((_, version)) => self
                    .conn
                    .raw(c.set_data(&path, value.as_bytes(), Some(version)))
                    .await
                    .map(|_| ()),
                None => {
                    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    self.conn
                        .raw(c.create(&path, value.as_bytes(), &options))
                        .await
                        .map(|_| ())
                }
            };
            match written {
                Ok(()) => return Ok(Admission::Admitted),
                // Someone else admitted a token meanwhile: judge again.
                Err(zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode) => {}
                Err(e) => return Err(map("admitting a token", e)),
            }
        }
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.record(resource).await?.and_then(|r| r.writer()))
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.record(resource).await?.map(|r| r.highest()))
    }
}
