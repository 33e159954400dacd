//! The Lua scripts. Each operation is one script, so one round trip and one
//! atomic step on the server; a [`Call`] sends EVALSHA and falls back to
//! SCRIPT LOAD + EVALSHA on NOSCRIPT (e.g. after a restart or SCRIPT FLUSH).
//!
//! Every script reads the clock with `TIME` *before* writing. Redis 5.0+
//! replicates script effects rather than the script, so this is allowed and
//! deterministic on replicas (Redis 6.2 and 7.x behave the same here).
//!
//! Numbers: tokens and times are written with `string.format('%d')` because a
//! Lua number passed to `redis.call` would be formatted as `%.17g` (e.g.
//! `1.7e+15`). Lua doubles hold integers exactly up to 2^53, which
//! microsecond timestamps stay below for the next ~200 years.

use redis::{
    aio::ConnectionLike, Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ToRedisArgs,
};

/// Shared Lua: the holder of KEYS[1] in the shape every script returns:
/// `{found, owner, token, kind, data, acquired_ms, pttl_ms, now_ms,
/// expires_ms}`. `expires_ms` (server clock, written by acquire and renew) is
/// for display: deriving it from `now + PTTL` would jitter by a millisecond
/// between calls.
const DESCRIBE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function describe(key)
  local h = redis.call('HMGET', key, 'owner', 'token', 'kind', 'data', 'acquired', 'expires')
  local pttl = redis.call('PTTL', key)
  if not h[1] or pttl == -2 then
    return {0, false, false, false, false, false, -2, now_ms(), false}
  end
  return {1, h[1], h[2], h[3], h[4], h[5], pttl, now_ms(), h[6]}
end
"#;

/// KEYS: lease, counter. ARGV: owner, ttl_ms, kind (`""` = none, else `=`
/// followed by the kind), data (`""` = none), token floor (`""` = none,
/// else a decimal below 2^53).
/// Returns `{1, token, now_ms}` or the holder as `describe` does (`found` = 1
/// means held; the leading element is then 0 to tell it from a grant).
const ACQUIRE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local d = describe(KEYS[1])
  d[1] = 0
  return d
end
local t = redis.call('TIME')
-- A token is never below the server clock in microseconds. So a counter that
-- is missing (first use, restart without persistence, idle expiry) or older
-- than the tokens it issued (restart from an old RDB snapshot or an
-- `everysec` AOF, a replica promoted before it caught up) still continues
-- above every token issued before, as long as the clock did not step back
-- and the key was granted less than once per microsecond.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- A floor raises the counter before the draw, in this same script, so the
-- token is above the floor and above every token issued before (I2).
if #ARGV[5] > 0 then
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
  if counter < tonumber(ARGV[5]) then
    redis.call('SET', KEYS[2], ARGV[5])
  end
end
local drawn = redis.call('INCR', KEYS[2])
if drawn < now_us then
  drawn = now_us
  redis.call('SET', KEYS[2], string.format('%d', drawn))
end
local token = string.format('%d', drawn)
-- A counter idle for a week goes away, so that locks on unbounded keys
-- (`order:<id>`) leave nothing behind.
redis.call('PEXPIRE', KEYS[2], 604800000)
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token, 'acquired', string.format('%d', now),
  'expires', string.format('%d', now + tonumber(ARGV[2])))
if #ARGV[3] > 0 then redis.call('HSET', KEYS[1], 'kind', string.sub(ARGV[3], 2)) end
if #ARGV[4] > 0 then redis.call('HSET', KEYS[1], 'data', ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token, now}
"#;

/// KEYS: lease. ARGV: owner, token, ttl_ms. Returns `{1, now_ms}` or `{0}`.
const RENEW: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'expires', string.format('%d', now + tonumber(ARGV[3])))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, now}
end
return {0}
"#;

/// A batch of renewals in one script: KEYS: the leases; ARGV: owner, token,
/// ttl_ms for each lease in turn. Returns `{now_ms, r1, r2, …}`, `ri` being
/// 1 when lease i was renewed (as `RENEW` would) and 0 when it is not held.
/// One script rather than a pipeline of `RENEW`s: the client encodes and
/// parses one command, and the server runs one script. (Under Redis Cluster
/// a batch must first be split by hash slot.)
const RENEW_MANY: &str = r#"
local now = now_ms()
local out = {now}
for i = 1, #KEYS do
  local owner, token, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local h = redis.call('HMGET', KEYS[i], 'owner', 'token')
  if h[1] == owner and h[2] == token then
    redis.call('HSET', KEYS[i], 'expires', string.format('%d', now + tonumber(ttl)))
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
"#;

/// KEYS: lease. ARGV: owner, token, channel, user key. Returns 1 or 0.
const RELEASE: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
"#;

/// KEYS: lease. ARGV: owner, token, data (`""` = none). Returns 1 or 0.
/// HSET and HDEL keep the key's PTTL, so the lease's end does not move.
const SET_DATA: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  if #ARGV[3] > 0 then
    redis.call('HSET', KEYS[1], 'data', ARGV[3])
  else
    redis.call('HDEL', KEYS[1], 'data')
  end
  return 1
end
return 0
"#;

/// KEYS: lease. Returns `describe`.
const INSPECT: &str = "return describe(KEYS[1])";

/// KEYS: lease. ARGV: channel, user key. Returns `describe` of what it removed.
const FORCE_RELEASE: &str = r#"
local d = describe(KEYS[1])
if d[1] == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return d
"#;

/// KEYS: fence record. ARGV: token (decimal u64). Tokens are compared as
/// decimal strings (length, then bytes) because Lua numbers cannot hold every
/// u64. Returns `{1}` (admitted) or `{0, current}`.
const FENCE_ADMIT: &str = r#"
local cur = redis.call('GET', KEYS[1])
local t = ARGV[1]
if cur and (#cur > #t or (#cur == #t and cur > t)) then
  return {0, cur}
end
if not cur or cur ~= t then redis.call('SET', KEYS[1], t) end
return {1}
"#;

/// The compiled scripts of one backend or fence.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
    pub(crate) renew_many: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) force_release: Script,
    pub(crate) fence_admit: Script,
    pub(crate) set_data: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with_describe = |body: &str| Script::new(&format!("{DESCRIBE}\n{body}"));
        Self {
            acquire: with_describe(ACQUIRE),
            renew: with_describe(RENEW),
            renew_many: with_describe(RENEW_MANY),
            release: Script::new(RELEASE),
            inspect: with_describe(INSPECT),
            force_release: with_describe(FORCE_RELEASE),
            fence_admit: Script::new(FENCE_ADMIT),
            set_data: Script::new(SET_DATA),
        }
    }

    pub(crate) fn all(&self) -> [&Script; 8] {
        [
            &self.acquire,
            &self.renew,
            &self.renew_many,
            &self.release,
            &self.inspect,
            &self.force_release,
            &self.fence_admit,
            &self.set_data,
        ]
    }
}

/// One `EVALSHA` of a script, its keys and arguments written straight into
/// the command. (`redis::ScriptInvocation` keeps a vector per key and
/// argument and copies them all into a command when sent: on the hot path
/// that was an allocation per argument of every lock operation.)
pub(crate) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    /// A call of `script` with `keys` keys, to be added with [`Call::key`]
    /// before any [`Call::arg`].
    pub(crate) fn new(script: &'a Script, keys: usize) -> Self {
        Self::with_capacity(script, keys, 0, 0)
    }

    /// As [`Call::new`], with room for `args` keys and arguments of
    /// `bytes` bytes in all, so that a large batch is not copied as its
    /// command grows.
    pub(crate) fn with_capacity(
        script: &'a Script,
        keys: usize,
        args: usize,
        bytes: usize,
    ) -> Self {
        let hash = script.get_hash();
        let mut cmd = Cmd::with_capacity(3 + args, "EVALSHA".len() + hash.len() + 20 + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys);
        Self { script, cmd }
    }

    /// Appends `KEYS[i]`.
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// Appends `ARGV[i]`.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call, loading the script first if the server has lost it.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}
