//! The scripts each node runs, on top of the Redis backend's Lua helpers
//! and lease layout (so that the Redis backend's own renew, release,
//! inspect and list scripts work on a node's leases unchanged).
//!
//! Every node keeps a marker hash `PREFIX:redlock` with `votes_from` (ms,
//! node clock: before it the node grants nothing), `floor` (every token it
//! answers is above it) and `hwm` (the highest token it granted). A node
//! without it is *unformed*: it has never joined, or it lost its data. See
//! `docs/redlock.md` for why this keeps I1 and I2.

use fencelock_core::Result;
use fencelock_redis::{node::map_error, RedisBackend};
use redis::Script;

/// KEYS: marker, counter. Returns `{formed, votes_in_ms, top, hwm,
/// age_ms, now_us}`: `formed` 0 or 1; `votes_in_ms` how long until the
/// node votes (≤ 0: it votes now); `top` the least token this node could
/// have issued for the key (its counter, its floor, or its clock in µs,
/// whichever is highest); `hwm` the highest token it granted for any key;
/// `age_ms` how long ago it was formed (node clock); `now_us` its clock.
const PROBE: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'votes_from', 'floor', 'hwm', 'born')
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local now_s = string.format('%d', now_us)
if not m[1] then return {0, 0, now_s, '0', 0, now_s} end
local top = tonumber(redis.call('GET', KEYS[2]) or '0')
local floor = tonumber(m[2] or '0')
if floor > top then top = floor end
if now_us > top then top = now_us end
return {1, tonumber(m[1]) - now_ms, string.format('%d', top), m[3] or '0',
  now_ms - tonumber(m[4] or '0'), now_s}
"#;

/// KEYS: marker, lease, counter. ARGV: owner, ttl_ms, kind (`""` = none,
/// else `=` and the kind), data (`""` = none), token, replace (`""` =
/// none, else the token this attempt last sent this node). Grants the
/// lease with that token iff the node is formed and out of quarantine, the
/// key is free, and the token is above the key's counter and the node's
/// floor. A copy of the owner's with token `replace` is this attempt's own
/// from an earlier round: it counts as free, and with the same token it is
/// only refreshed (no counter is written: the counter holds that token).
/// Returns `{1, now_ms, now_us}`; the holder as `describe` with a leading
/// 0; `{-1}` unformed; `{-2}` quarantined; `{-3, top}` the token is not
/// above the counter or floor (a concurrent acquirer drew as high, or the
/// client's guess was low), `top` being what the probe would answer.
const GRANT: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'votes_from', 'floor', 'hwm')
if not m[1] then return {-1} end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if now < tonumber(m[1]) then return {-2} end
local token = tonumber(ARGV[5])
local seen = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(m[2] or '0') > seen then seen = tonumber(m[2]) end
local refresh = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  local h = redis.call('HMGET', KEYS[2], 'owner', 'token')
  if #ARGV[6] == 0 or h[1] ~= ARGV[1] or h[2] ~= ARGV[6] then
    local d = describe(KEYS[2])
    d[1] = 0
    return d
  end
  refresh = ARGV[6] == ARGV[5]
end
if not refresh then
  if seen >= token then
    if now_us > seen then seen = now_us end
    return {-3, string.format('%d', seen)}
  end
  -- A counter idle for a week goes away (keys may be unbounded); `hwm`
  -- keeps every later token above it.
  redis.call('SET', KEYS[3], ARGV[5], 'PX', 604800000)
  if tonumber(m[3] or '0') < token then redis.call('HSET', KEYS[1], 'hwm', ARGV[5]) end
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'token', ARGV[5],
  'acquired', string.format('%d', now), 'expires', string.format('%d', now + tonumber(ARGV[2])))
if #ARGV[3] > 0 then redis.call('HSET', KEYS[2], 'kind', string.sub(ARGV[3], 2)) end
if #ARGV[4] > 0 then redis.call('HSET', KEYS[2], 'data', ARGV[4]) end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {1, now, string.format('%d', now_us)}
"#;

/// KEYS: marker. ARGV: quarantine_ms, floor, mode. Forms an unformed
/// node: it votes from now + quarantine_ms (node clock) and answers tokens
/// above `floor`, and by mode (docs/redlock.md) also above:
///
/// - `fresh` (a new set, or every node lost its data): its clock in µs
///   now, so that a client that probed before every node lost its data
///   cannot grant the token it drew then; `hwm` stays as given (0: the
///   node has granted nothing, which tells a set being formed apart);
/// - `reform` (a majority lost its data): what its clock in µs will read
///   when it starts to vote, since the tokens only the lost majority had
///   seen are known to nobody, only to be below the clocks;
/// - `join` (a minority lost its data): nothing more.
///
/// A node already formed is left alone (returns 0).
const JOIN: &str = r#"
if redis.call('HEXISTS', KEYS[1], 'votes_from') == 1 then return 0 end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local quarantine = tonumber(ARGV[1])
local floor = tonumber(ARGV[2])
local hwm = floor
if ARGV[3] == 'fresh' then
  if now_us > floor then floor = now_us end
elseif ARGV[3] == 'reform' then
  local at_vote = now_us + quarantine * 1000
  if at_vote > floor then floor = at_vote end
  hwm = floor
end
redis.call('HSET', KEYS[1], 'votes_from', string.format('%d', now + quarantine),
  'floor', string.format('%d', floor), 'hwm', string.format('%d', hwm),
  'born', string.format('%d', now))
return 1
"#;

/// The compiled scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) probe: Script,
    pub(crate) grant: Script,
    pub(crate) join: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with_helpers =
            |body: &str| Script::new(&format!("{}\n{body}", fencelock_redis::node::LUA_HELPERS));
        Self {
            probe: Script::new(PROBE),
            grant: with_helpers(GRANT),
            join: Script::new(JOIN),
        }
    }

    /// Loads every script into `node` at once: one round trip while the
    /// node opens, rather than a `NOSCRIPT` and a load on the first use of
    /// each, which on a far node cost three round trips of an operation's
    /// bound.
    pub(crate) async fn load(&self, node: &RedisBackend) -> Result<()> {
        futures_util::future::try_join_all([&self.probe, &self.grant, &self.join].map(|script| {
            let mut conn = node.bounded_by(node.options().connect_timeout).connection();
            async move {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .map(drop)
                    .map_err(|e| map_error("SCRIPT LOAD", e))
            }
        }))
        .await
        .map(drop)
    }
}
