//! [`ZkFence`]: the I7 fence as a compare-and-set on a node's version.

use std::{fmt, sync::Arc};

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FenceRecord, FencedValue, FencingToken, LockMode, Result};
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
/// A fenced value is the fence node's child `value` (the writer's token in
/// decimal, a newline, the value's bytes), written in the same multi op as
/// the fence node. A reset deletes the value and the fence node in one
/// multi op, the fence node's delete conditional on the version it read.
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

    fn value_path(&self, resource: &str) -> String {
        format!("{}/value", self.path(resource))
    }

    /// Admits `token` held in `mode` and, with `value`, stores it in the
    /// same multi op, which checks the fence node's version.
    async fn admit_with(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
        value: Option<&[u8]>,
    ) -> Result<Admission> {
        let c = self.conn.client().await?;
        let path = self.path(resource);
        let value = value.map(|v| {
            let stored = FencedValue::new(token, v.to_vec()).to_record();
            (self.value_path(resource), stored)
        });
        let create = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        loop {
            let current = self.read(&c, &path).await?;
            let next = match FenceRecord::admit(current.map(|(r, _)| r), token, mode) {
                Ok(next) => next,
                Err(floor) => return Ok(Admission::Stale { current: floor }),
            };
            let record = next.to_string();
            let mut multi = c.new_multi_writer();
            let added = match current {
                Some((stored, _)) if stored == next && value.is_none() => {
                    return Ok(Admission::Admitted)
                }
                Some((_, version)) => multi.add_set_data(&path, record.as_bytes(), Some(version)),
                None => multi.add_create(&path, record.as_bytes(), &create),
            };
            added.map_err(|e| map("admitting a token", e))?;
            if let Some((value_path, stored)) = &value {
                // Any version: the fence node's version, checked above,
                // orders the writers of the value.
                let exists = current.is_some()
                    && self
                        .conn
                        .raw(c.check_stat(value_path))
                        .await
                        .map_err(|e| map("reading a fenced value", e))?
                        .is_some();
                let added = if exists {
                    multi.add_set_data(value_path, stored, None)
                } else {
                    multi.add_create(value_path, stored, &create)
                };
                added.map_err(|e| map("writing a fenced value", e))?;
            }
            let commit = multi.commit();
            match self
                .conn
                .raw(async { commit.await.map_err(zk::Error::from) })
                .await
            {
                Ok(_) => return Ok(Admission::Admitted),
                // Someone else admitted a token meanwhile: judge again.
                Err(zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode) => {}
                Err(e) => return Err(map("admitting a token", e)),
            }
        }
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
        self.admit_with(resource, token, mode, None).await
    }

    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        self.admit_with(resource, token, LockMode::Exclusive, Some(value))
            .await
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let c = self.conn.client().await?;
        let path = self.value_path(resource);
        let Some((bytes, _)) = self
            .conn
            .maybe("reading a fenced value", c.get_data(&path))
            .await?
        else {
            return Ok(None);
        };
        FencedValue::from_record(&bytes)
            .map(Some)
            .ok_or_else(|| bad_value(format!("{path} does not start with its token")))
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.record(resource).await?.and_then(|r| r.writer()))
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let c = self.conn.client().await?;
        let (path, value_path) = (self.path(resource), self.value_path(resource));
        loop {
            let Some((record, version)) = self.read(&c, &path).await? else {
                return Ok(None);
            };
            let has_value = self
                .conn
                .raw(c.check_stat(&value_path))
                .await
                .map_err(|e| map("reading a fenced value", e))?
                .is_some();
            let mut multi = c.new_multi_writer();
            // The child first: ZooKeeper deletes no node that has children.
            // Any version of it: a value is only ever written together with
            // a change of the fence node, whose version is checked.
            if has_value {
                multi
                    .add_delete(&value_path, None)
                    .map_err(|e| map("resetting a fence", e))?;
            }
            multi
                .add_delete(&path, Some(version))
                .map_err(|e| map("resetting a fence", e))?;
            let commit = multi.commit();
            match self
                .conn
                .raw(async { commit.await.map_err(zk::Error::from) })
                .await
            {
                Ok(_) => return Ok(Some(record.highest())),
                // An admission (or another reset) changed the node or its
                // value since our read: judge again.
                Err(zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NotEmpty) => {}
                Err(e) => return Err(map("resetting a fence", e)),
            }
        }
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        Ok(self.record(resource).await?.map(|r| r.highest()))
    }
}
