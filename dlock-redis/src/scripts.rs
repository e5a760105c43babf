//! The Lua scripts. Each runs by SHA; the redis crate loads it again only
//! when the server answers NOSCRIPT (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// How long the fencing counter outlives the last grant or extension.
/// Tokens are never below the server's clock in microseconds, so once the
/// counter is gone (expired, or lost in a restart without persistence) the
/// clock alone keeps the next token above every earlier one. The retention
/// only has to cover the server's clock stepping back.
pub(crate) const FENCE_RETENTION_MS: u64 = 60 * 60 * 1000;

/// KEYS: lock, fence. ARGV: owner token, TTL in ms, fence retention in ms.
/// Returns `{1, fencing token}` when granted, `{0, holder's PTTL}` when held.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  local fence = string.format('%.0f', math.max(last + 1, now))
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
  return {1, fence}
end
return {0, tostring(redis.call('PTTL', KEYS[1]))}
",
    )
});

/// KEYS: lock. ARGV: owner token, channel, lock name.
/// Returns 1 when released, 0 when the caller was not the holder.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
",
    )
});

/// KEYS: lock, fence. ARGV: owner token, TTL in ms, fence retention in ms.
/// Returns 1 when extended, 0 when the caller was not the holder.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0
",
    )
});

/// EXTEND for many locks at once. KEYS: lock and fence of each lock, in
/// turn. ARGV: fence retention in ms, then owner token and TTL in ms of each
/// lock. Returns one 1 (extended) or 0 (not the holder) per lock.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * i - 1]) == ARGV[2 * i] then
    redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[2 * i + 1])
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
",
    )
});

/// KEYS: lock. ARGV: owner token, the hold's owner token, hold in ms.
/// Returns 1 when the hold is set, 0 when the caller was not the holder.
pub(crate) static HOLD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
",
    )
});

/// KEYS: lock, fence. Returns `{owner, PTTL, fencing token}`, or an empty
/// array when the lock is free.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = redis.call('GET', KEYS[1])
if not owner then
  return {}
end
return {owner, tostring(redis.call('PTTL', KEYS[1])), redis.call('GET', KEYS[2]) or '0'}
",
    )
});
