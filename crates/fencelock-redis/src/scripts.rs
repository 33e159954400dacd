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

/// How a writer's lease is stored, in Lua: `lease_get(key)` answers its
/// fields `{owner, token, kind, data, acquired, expires}` (`false` where
/// absent; `foreign = true` for a key held by another library's lock, which
/// the hash layout never sees), and `lease_set(key, changes, ttl)` writes
/// the `changes` (field = value, `false` deletes) and, with a `ttl`, sets
/// the key's expiry (without one the expiry stays). The fencelock layout
/// keeps a hash at `PREFIX:{KEY}`.
macro_rules! hash_store {
    () => {
        r#"
local function lease_get(key)
  return redis.call('HMGET', key, 'owner', 'token', 'kind', 'data', 'acquired', 'expires')
end
local function lease_set(key, changes, ttl)
  local set, del = {}, {}
  for f, v in pairs(changes) do
    if v then set[#set + 1] = f; set[#set + 1] = v else del[#del + 1] = f end
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if #del > 0 then redis.call('HDEL', key, unpack(del)) end
  if ttl then redis.call('PEXPIRE', key, ttl) end
end
"#
    };
}

/// The `plain` layout's store (docs/redis.md): the lease is a string at the
/// user's key itself, `fencelock:` followed by the fields as JSON, with a
/// `PX` expiry, so the `SET key random NX PX ttl` of the single-instance
/// lock recipe (redis-py's `Lock`, redsync, rslock, node-redlock) fails on
/// it, and their compare-and-delete leaves it alone. Any other value, or a
/// key of another type, is another library's holder.
macro_rules! plain_store {
    () => {
        r#"
local FIELDS = {'owner', 'token', 'kind', 'data', 'acquired', 'expires'}
local MARK = 'fencelock:'
local function lease_get(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then return {false, false, false, false, false, false} end
  if t == 'string' then
    local v = redis.call('GET', key)
    if string.sub(v, 1, #MARK) == MARK then
      local ok, r = pcall(cjson.decode, string.sub(v, #MARK + 1))
      if ok and type(r) == 'table' then
        local h = {}
        for i, f in ipairs(FIELDS) do h[i] = type(r[f]) == 'string' and r[f] or false end
        return h
      end
    end
  end
  return {false, false, false, false, false, false, foreign = true}
end
local function lease_set(key, changes, ttl)
  local h, r = lease_get(key), {}
  for i, f in ipairs(FIELDS) do if h[i] then r[f] = h[i] end end
  for f, v in pairs(changes) do if v then r[f] = v else r[f] = nil end end
  local v = MARK .. cjson.encode(r)
  if ttl then
    redis.call('SET', key, v, 'PX', ttl)
  else
    redis.call('SET', key, v, 'KEEPTTL')
  end
end
"#
    };
}

/// Shared Lua over a store (`hash_store!` or `plain_store!`): the holder of
/// `KEYS[1]` in the shape every script returns: `{found, owner, token,
/// kind, data, acquired_ms, pttl_ms, now_ms, expires_ms}`. `expires_ms`
/// (server clock, written by acquire and renew) is for display: deriving it
/// from `now + PTTL` would jitter by a millisecond between calls. Another
/// library's holder is `{1, 'foreign', '0', 'foreign', …}`: it has no
/// token, and 0 is never issued.
macro_rules! helpers {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function describe(key)
  local h = lease_get(key)
  local pttl = redis.call('PTTL', key)
  if h.foreign and pttl ~= -2 then
    return {1, 'foreign', '0', 'foreign',
      '{"fencing_token":null,"holder":"another library\'s lock, which carries no fencing token"}',
      false, pttl, now_ms(), false}
  end
  if not h[1] or pttl == -2 then
    return {0, false, false, false, false, false, -2, now_ms(), false}
  end
  return {1, h[1], h[2], h[3], h[4], h[5], pttl, now_ms(), h[6]}
end
-- Read-write locks (docs/rwlock.md): the key's readers are a sorted set
-- (member: token, score: the lease's end in server ms) and a hash of their
-- details (field: token, value: JSON), under the key's hash tag.
-- Removes the readers whose lease ended; how many are left.
local function prune(readers, info, now)
  local gone = redis.call('ZRANGEBYSCORE', readers, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
    redis.call('HDEL', info, unpack(gone))
  end
  return redis.call('ZCARD', readers)
end
-- A reader in `describe`'s shape, plus a final 1 for "shared".
local function describe_reader(readers, info, token, now)
  local r = cjson.decode(redis.call('HGET', info, token))
  local ends = tonumber(redis.call('ZSCORE', readers, token))
  return {1, r.owner, token, r.kind or false, r.data or false, r.acquired, ends - now, now,
    string.format('%d', ends), 1}
end
-- The live reader whose lease ends last, or nil.
local function last_reader(readers, info, now)
  if prune(readers, info, now) == 0 then return nil end
  local top = redis.call('ZRANGE', readers, -1, -1)
  return describe_reader(readers, info, top[1], now)
end
-- Keeps the readers' keys as long as their longest lease.
local function keep(readers, info, ttl)
  for _, k in ipairs({readers, info}) do
    if redis.call('PTTL', k) < tonumber(ttl) then redis.call('PEXPIRE', k, ttl) end
  end
end
-- Tokens end at 2^53 - 1 (FencingToken::MAX), the last integer from which
-- a Lua number still counts up exactly: past it, the next token would be
-- rounded and a token repeated.
local MAX_TOKEN = 9007199254740991
-- The key's counter, raised to the floor if one is given (a floor raises
-- the counter before a draw, so the token is above the floor and above
-- every token issued before, I2).
local function counted(counter, floor)
  local c = tonumber(redis.call('GET', counter) or '0')
  if #floor > 0 and tonumber(floor) > c then c = tonumber(floor) end
  return c
end
-- Whether the key has no token left; a script that grants several keys
-- checks each with it before it writes anything.
local function spent(counter, floor)
  return counted(counter, floor) >= MAX_TOKEN
end
-- Draws a token from the key's one counter (for writers and readers alike):
-- the token and the server's now in ms, or nil, with nothing written, when
-- the key has no token left. One GET and one SET: the script is atomic, so
-- reading the counter and writing the next value is an INCR that also
-- raises it to the floor and the clock and sets its expiry.
local function draw(counter, floor)
  local c = counted(counter, floor)
  if c >= MAX_TOKEN then return nil end
  local t = redis.call('TIME')
  -- A token is never below the server clock in microseconds. So a counter
  -- that is missing (first use, restart without persistence, idle expiry) or
  -- older than the tokens it issued (restart from an old RDB snapshot or an
  -- `everysec` AOF, a replica promoted before it caught up) still continues
  -- above every token issued before, as long as the clock did not step back
  -- and the key was granted less than once per microsecond.
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local drawn = c + 1
  if drawn < now_us then drawn = now_us end
  -- A counter idle for a week goes away, so that locks on unbounded keys
  -- (`order:<id>`) leave nothing behind.
  redis.call('SET', counter, string.format('%d', drawn), 'PX', 604800000)
  return string.format('%d', drawn), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- What keeps a writer from a key: its holder, else its reader whose lease
-- ends last, as `describe` with a leading 0; nil when it is free.
local function blocker(lease, readers, info)
  if redis.call('EXISTS', lease) == 1 then
    local d = describe(lease)
    d[1] = 0
    return d
  end
  local reader = last_reader(readers, info, now_ms())
  if reader then
    reader[1] = 0
    return reader
  end
  return nil
end
-- Writes a writer's lease on a free key (ARGV layout of `ACQUIRE`),
-- withdrawing its owner's intent (`intent` false: known to be absent): the
-- token and the server's now in ms, or nil when the key's tokens are spent.
local function grant(lease, counter, intent, owner, ttl, kind, data, floor)
  local token, now = draw(counter, floor)
  if not token then return nil end
  if intent and redis.call('GET', intent) == owner then redis.call('DEL', intent) end
  local fields = {owner = owner, token = token, acquired = string.format('%d', now),
    expires = string.format('%d', now + tonumber(ttl))}
  if #kind > 0 then fields.kind = string.sub(kind, 2) end
  if #data > 0 then fields.data = data end
  lease_set(lease, fields, ttl)
  return token, now
end
"#
    };
}

/// The Lua helpers over the fencelock layout's lease hashes, which the
/// `redlock` backend runs its own scripts over.
pub const DESCRIBE: &str = concat!(hash_store!(), helpers!());

/// The Lua helpers over the `plain` layout.
const PLAIN_DESCRIBE: &str = concat!(plain_store!(), helpers!());

/// KEYS: lease, counter, readers, readers' details, writer intent. ARGV:
/// owner, ttl_ms, kind (`""` = none, else `=` followed by the kind), data
/// (`""` = none), token floor (`""` = none, else a decimal of at most
/// 2^52, `FencingToken::MAX_FLOOR`), the store's change channel, user key
/// (a grant publishes the user key there, see `wakeups.rs`). Returns `{1, token, now_ms}`, `{2}`
/// when the key's tokens are spent, or the holder as `describe` does
/// (`found` = 1 means held; the leading element is then 0 to tell it from
/// a grant): the writer, or the reader whose lease ends last. A grant
/// withdraws its owner's intent.
const ACQUIRE: &str = r#"
-- Most grants are of a key with no writer, no reader and no writer's
-- intent: one EXISTS says so, and then neither the readers nor the intent
-- need a look (Lua calls are most of a script's cost on the server).
local free = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5]) == 0
if not free then
  local held = blocker(KEYS[1], KEYS[3], KEYS[4])
  if held then return held end
end
local token, now = grant(KEYS[1], KEYS[2], not free and KEYS[5],
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if not token then return {2} end
redis.call('PUBLISH', ARGV[6], ARGV[7])
return {1, token, now}
"#;

/// Several keys at once, all or nothing: KEYS and ARGV are those of
/// `ACQUIRE`'s first five for each key in turn (five keys, five arguments
/// per key), then the store's change channel and the user keys. Every
/// key is checked before any is written, and nothing after the checks can
/// fail, so a script never stops half way. Returns `{1, token1, now1,
/// token2, now2, …}`, or `{0, i, holder}` with `i` the 0-based index of the
/// first key held and `holder` as `ACQUIRE` answers it, or `{2, i}` when
/// the tokens of key `i` are spent.
const ACQUIRE_ALL: &str = r#"
local n = #KEYS / 5
for i = 1, n do
  local k = 5 * (i - 1)
  local held = blocker(KEYS[k + 1], KEYS[k + 3], KEYS[k + 4])
  if held then return {0, i - 1, held} end
  if spent(KEYS[k + 2], ARGV[k + 5]) then return {2, i - 1} end
end
local out = {1}
for i = 1, n do
  local k = 5 * (i - 1)
  local token, now = grant(KEYS[k + 1], KEYS[k + 2], KEYS[k + 5],
    ARGV[k + 1], ARGV[k + 2], ARGV[k + 3], ARGV[k + 4], ARGV[k + 5])
  out[2 * i] = token
  out[2 * i + 1] = now
  redis.call('PUBLISH', ARGV[5 * n + 1], ARGV[5 * n + 1 + i])
end
return out
"#;

/// KEYS: lease. ARGV: owner, token, ttl_ms. Returns `{1, now_ms}` or `{0}`.
const RENEW: &str = r#"
local h = lease_get(KEYS[1])
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  local now = now_ms()
  lease_set(KEYS[1], {expires = string.format('%d', now + tonumber(ARGV[3]))}, ARGV[3])
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
  local h = lease_get(KEYS[i])
  if h[1] == owner and h[2] == token then
    lease_set(KEYS[i], {expires = string.format('%d', now + tonumber(ttl))}, ttl)
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
"#;

/// KEYS: lease. ARGV: owner, token, channel, user key, the store's change
/// channel. Returns 1 or 0.
const RELEASE: &str = r#"
local h = lease_get(KEYS[1])
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  redis.call('PUBLISH', ARGV[5], ARGV[4])
  return 1
end
return 0
"#;

/// KEYS: lease. ARGV: owner, token, data (`""` = none). Returns 1 or 0.
/// Without a TTL `lease_set` keeps the key's PTTL, so the lease's end does
/// not move.
const SET_DATA: &str = r#"
local h = lease_get(KEYS[1])
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  lease_set(KEYS[1], {data = #ARGV[3] > 0 and ARGV[3] or false})
  return 1
end
return 0
"#;

/// KEYS: lease, readers, readers' details. Returns `describe` of the
/// writer, else of the reader whose lease ends last.
const INSPECT: &str = r#"
local d = describe(KEYS[1])
if d[1] == 1 then return d end
return last_reader(KEYS[2], KEYS[3], now_ms()) or d
"#;

/// KEYS: lease, readers, readers' details, intent. ARGV: channel, user key,
/// the store's change channel.
/// Frees the key entirely; returns `describe` of the writer, else of the
/// reader whose lease ends last. Another library's holder is left alone:
/// `{-1}`.
const FORCE_RELEASE: &str = r#"
local d = describe(KEYS[1])
if d[2] == 'foreign' and d[3] == '0' then return {-1} end
if d[1] ~= 1 then d = last_reader(KEYS[2], KEYS[3], now_ms()) or d end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if d[1] == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[2])
end
return d
"#;

/// KEYS: lease, counter, readers, readers' details, intent. ARGV as
/// `ACQUIRE`. Granted while no writer holds the key and no writer's intent
/// is live: `{1, token, now_ms}`, else the writer as `describe` (or nobody,
/// for an intent) with a leading 0, or `{2}` when the key's tokens are
/// spent.
const ACQUIRE_SHARED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local d = describe(KEYS[1])
  d[1] = 0
  return d
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {0, false, false, false, false, false, -2, now_ms(), false}
end
local token, now = draw(KEYS[2], ARGV[5])
if not token then return {2} end
prune(KEYS[3], KEYS[4], now)
local r = {owner = ARGV[1], acquired = string.format('%d', now)}
if #ARGV[3] > 0 then r.kind = string.sub(ARGV[3], 2) end
if #ARGV[4] > 0 then r.data = ARGV[4] end
redis.call('ZADD', KEYS[3], string.format('%d', now + tonumber(ARGV[2])), token)
redis.call('HSET', KEYS[4], token, cjson.encode(r))
keep(KEYS[3], KEYS[4], ARGV[2])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return {1, token, now}
"#;

/// A batch of reader renewals: KEYS: readers and readers' details of each
/// lease in turn; ARGV: owner, token, ttl_ms of each. Returns
/// `{now_ms, r1, r2, …}` as `RENEW_MANY` does.
const RENEW_MANY_SHARED: &str = r#"
local now = now_ms()
local out = {now}
for i = 1, #ARGV / 3 do
  local readers, info = KEYS[2 * i - 1], KEYS[2 * i]
  local owner, token, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local ends = redis.call('ZSCORE', readers, token)
  out[i + 1] = 0
  if ends and tonumber(ends) > now then
    local r = cjson.decode(redis.call('HGET', info, token))
    if r.owner == owner then
      redis.call('ZADD', readers, 'XX', string.format('%d', now + tonumber(ttl)), token)
      keep(readers, info, ttl)
      out[i + 1] = 1
    end
  end
end
return out
"#;

/// KEYS: readers, readers' details. ARGV: owner, token, channel, user key,
/// the store's change channel. Returns 1 or 0.
const RELEASE_SHARED: &str = r#"
local ends = redis.call('ZSCORE', KEYS[1], ARGV[2])
if ends and tonumber(ends) > now_ms() then
  local r = cjson.decode(redis.call('HGET', KEYS[2], ARGV[2]))
  if r.owner == ARGV[1] then
    redis.call('ZREM', KEYS[1], ARGV[2])
    redis.call('HDEL', KEYS[2], ARGV[2])
    redis.call('PUBLISH', ARGV[3], ARGV[4])
    redis.call('PUBLISH', ARGV[5], ARGV[4])
    return 1
  end
end
return 0
"#;

/// KEYS: intent. ARGV: owner, ttl_ms. Another owner's live intent stays.
const POST_INTENT: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"#;

/// KEYS: intent. ARGV: owner, channel, user key.
const WITHDRAW_INTENT: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
"#;

/// KEYS: readers, readers' details. The live readers as `describe` rows.
const READERS: &str = r#"
local now = now_ms()
prune(KEYS[1], KEYS[2], now)
local out = {}
for _, token in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  out[#out + 1] = describe_reader(KEYS[1], KEYS[2], token, now)
end
return out
"#;

/// KEYS: fence record, its writer record. ARGV: token (decimal u64), mode
/// (`w` writer, `r` reader). Tokens are compared as decimal strings
/// (length, then bytes) because Lua numbers cannot hold every u64. A
/// writer's token must reach the highest admitted and becomes the highest
/// writer token; a reader's must reach the highest writer token (a record
/// without a writer record is from before read-write locks: its token was a
/// writer's; `0` means none yet). Returns `{1}` (admitted) or
/// `{0, current}`, `current` being the floor the token missed. With a third
/// key (the resource's value hash) and ARGV[3] (a value), an admitted
/// writer also stores the value with its token: the fenced key-value store.
const FENCE_ADMIT: &str = r#"
local function above(a, b) return #a > #b or (#a == #b and a > b) end
local cur = redis.call('GET', KEYS[1])
local t = ARGV[1]
if ARGV[2] == 'w' then
  if cur and above(cur, t) then return {0, cur} end
  if not cur or cur ~= t then redis.call('SET', KEYS[1], t) end
  redis.call('SET', KEYS[2], t)
  if KEYS[3] then redis.call('HSET', KEYS[3], 'token', t, 'value', ARGV[3]) end
  return {1}
end
local w = redis.call('GET', KEYS[2])
if not w then
  w = cur or '0'
  redis.call('SET', KEYS[2], w)
end
if above(w, t) then return {0, w} end
if not cur or above(t, cur) then redis.call('SET', KEYS[1], t) end
return {1}
"#;

/// KEYS: fence record, its writer record, its value hash (one hash tag,
/// so one slot). Deletes all three and returns the record as it was (the
/// highest token admitted in either mode), or nil when there was none: a
/// script, so that no admission runs between the read and the delete.
const FENCE_RESET: &str = r#"
local cur = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return cur
"#;

/// The compiled scripts of one backend or fence.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) acquire_all: Script,
    pub(crate) renew: Script,
    pub(crate) renew_many: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) force_release: Script,
    pub(crate) fence_admit: Script,
    pub(crate) fence_reset: Script,
    pub(crate) set_data: Script,
    pub(crate) acquire_shared: Script,
    pub(crate) renew_many_shared: Script,
    pub(crate) release_shared: Script,
    pub(crate) post_intent: Script,
    pub(crate) withdraw_intent: Script,
    pub(crate) readers: Script,
}

impl Scripts {
    /// The scripts over the fencelock layout (hashes under the prefix), or
    /// over the `plain` layout (a string at the user's key).
    pub(crate) fn new(plain: bool) -> Self {
        let helpers = if plain { PLAIN_DESCRIBE } else { DESCRIBE };
        let with_describe = |body: &str| Script::new(&format!("{helpers}\n{body}"));
        Self {
            acquire: with_describe(ACQUIRE),
            acquire_all: with_describe(ACQUIRE_ALL),
            renew: with_describe(RENEW),
            renew_many: with_describe(RENEW_MANY),
            release: with_describe(RELEASE),
            inspect: with_describe(INSPECT),
            force_release: with_describe(FORCE_RELEASE),
            fence_admit: Script::new(FENCE_ADMIT),
            fence_reset: Script::new(FENCE_RESET),
            set_data: with_describe(SET_DATA),
            acquire_shared: with_describe(ACQUIRE_SHARED),
            renew_many_shared: with_describe(RENEW_MANY_SHARED),
            release_shared: with_describe(RELEASE_SHARED),
            post_intent: Script::new(POST_INTENT),
            withdraw_intent: Script::new(WITHDRAW_INTENT),
            readers: with_describe(READERS),
        }
    }

    pub(crate) fn all(&self) -> [&Script; 16] {
        [
            &self.acquire,
            &self.acquire_all,
            &self.renew,
            &self.renew_many,
            &self.release,
            &self.inspect,
            &self.force_release,
            &self.fence_admit,
            &self.fence_reset,
            &self.set_data,
            &self.acquire_shared,
            &self.renew_many_shared,
            &self.release_shared,
            &self.post_intent,
            &self.withdraw_intent,
            &self.readers,
        ]
    }
}

/// One `EVALSHA` of a script, its keys and arguments written straight into
/// the command. (`redis::ScriptInvocation` keeps a vector per key and
/// argument and copies them all into a command when sent: on the hot path
/// that was an allocation per argument of every lock operation.)
pub struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    /// A call of `script` with `keys` keys, to be added with [`Call::key`]
    /// before any [`Call::arg`].
    pub fn new(script: &'a Script, keys: usize) -> Self {
        Self::with_capacity(script, keys, 0, 0)
    }

    /// As [`Call::new`], with room for `args` keys and arguments of
    /// `bytes` bytes in all, so that a large batch is not copied as its
    /// command grows.
    pub fn with_capacity(script: &'a Script, keys: usize, args: usize, bytes: usize) -> Self {
        let hash = script.get_hash();
        let mut cmd = Cmd::with_capacity(3 + args, "EVALSHA".len() + hash.len() + 20 + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys);
        Self { script, cmd }
    }

    /// Appends `KEYS[i]`.
    pub fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// Appends `ARGV[i]`.
    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call, loading the script first if the server has lost it.
    pub async fn invoke<T: FromRedisValue>(
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
