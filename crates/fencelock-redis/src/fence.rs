//! [`RedisFence`]: the I7 fence as a script.

use std::fmt;

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencedValue, FencingToken, LockMode, Result};
use redis::Value;

use crate::{
    backend::connect,
    conn::BoundedConnection,
    error::{bad_reply, map},
    keys::Keys,
    options::RedisOptions,
    scripts::{Call, Scripts},
};

/// A fence in Redis: one string per resource (`PREFIX:fence:{RESOURCE}`)
/// holding the highest admitted token, checked and raised by one script,
/// which also stores a fenced value (`PREFIX:fence:{RESOURCE}:value`, a hash
/// of `token` and `value`) when it admits its writer. Another script
/// deletes the three keys of a resource to reset it.
#[derive(Clone)]
pub struct RedisFence {
    options: RedisOptions,
    conn: BoundedConnection,
    scripts: std::sync::Arc<Scripts>,
    keys: Keys,
}

impl fmt::Debug for RedisFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFence")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisFence {
    /// Connects with `options` (the fence uses the same key prefix).
    pub async fn connect_with(options: RedisOptions) -> Result<Self> {
        // Fence records are the same in both layouts.
        let scripts = Scripts::new(false);
        let keys = Keys::new(&options.prefix)?;
        let (_, conn) = connect(&options, &scripts).await?;
        Ok(Self {
            options,
            conn,
            scripts: std::sync::Arc::new(scripts),
            keys,
        })
    }

    /// Connects to `url` (see [`RedisOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(RedisOptions::from_url(url)?).await
    }
}

fn parse_token(s: &str) -> Result<FencingToken> {
    s.parse::<u64>()
        .map(FencingToken)
        .map_err(|_| bad_reply(format!("fence record {s:?} is not a u64")))
}

#[async_trait]
impl Fence for RedisFence {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let (writer, any): (Option<String>, Option<String>) = redis::pipe()
            .cmd("GET")
            .arg(self.keys.fence_writer(resource))
            .cmd("GET")
            .arg(self.keys.fence(resource))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| map("fence GET", e))?;
        // No writer record: a record from before read-write locks, whose
        // token was a writer's. `0`: readers only.
        match writer.or(any).as_deref() {
            None | Some("0") => Ok(None),
            Some(t) => parse_token(t).map(Some),
        }
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let mode = match mode {
            LockMode::Exclusive => "w",
            LockMode::Shared => "r",
        };
        let mut call = Call::new(&self.scripts.fence_admit, 2);
        call.key(self.keys.fence(resource))
            .key(self.keys.fence_writer(resource))
            .arg(token.0)
            .arg(mode);
        self.admission(&call).await
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
        let mut call = Call::new(&self.scripts.fence_admit, 3);
        call.key(self.keys.fence(resource))
            .key(self.keys.fence_writer(resource))
            .key(self.keys.fence_value(resource))
            .arg(token.0)
            .arg("w")
            .arg(value);
        self.admission(&call).await
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let (token, value): (Option<String>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(self.keys.fence_value(resource))
            .arg("token")
            .arg("value")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| map("fence HMGET", e))?;
        match (token, value) {
            (Some(token), Some(value)) => Ok(Some(FencedValue::new(parse_token(&token)?, value))),
            (None, None) => Ok(None),
            _ => Err(bad_reply(
                "a fenced value without its token, or the reverse",
            )),
        }
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let mut call = Call::new(&self.scripts.fence_reset, 3);
        call.key(self.keys.fence(resource))
            .key(self.keys.fence_writer(resource))
            .key(self.keys.fence_value(resource));
        let had: Option<String> = call
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| map("fence reset script", e))?;
        had.as_deref().map(parse_token).transpose()
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let current: Option<String> = redis::cmd("GET")
            .arg(self.keys.fence(resource))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| map("fence GET", e))?;
        current.as_deref().map(parse_token).transpose()
    }
}

impl RedisFence {
    /// Runs the fence script `call` and reads its answer.
    async fn admission(&self, call: &Call<'_>) -> Result<Admission> {
        let row: Vec<Value> = call
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| map("fence script", e))?;
        let admitted: i64 = row
            .first()
            .map(redis::from_redis_value)
            .transpose()
            .map_err(|e| bad_reply(format!("fence reply: {e}")))?
            .ok_or_else(|| bad_reply("empty fence reply"))?;
        if admitted == 1 {
            return Ok(Admission::Admitted);
        }
        let current: String = row
            .get(1)
            .map(redis::from_redis_value)
            .transpose()
            .map_err(|e| bad_reply(format!("fence reply: {e}")))?
            .ok_or_else(|| bad_reply("fence refusal without a token"))?;
        Ok(Admission::Stale {
            current: parse_token(&current)?,
        })
    }
}
