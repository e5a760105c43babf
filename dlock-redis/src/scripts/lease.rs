//! The scripts on a held mutex that no queue takes part in: extend (one
//! lease or many), a release that keeps the lock held for a while, and the
//! holders' listing.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: lock value, TTL in ms, fence retention in ms.
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
/// turn. ARGV: fence retention in ms, then lock value and TTL in ms of each
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

/// KEYS: lock, and on a cluster the release mark. ARGV: lock value, the
/// hold's lock value, hold in ms, and on a cluster the request's id and
/// how long to remember it in ms. Returns 1 when the hold is set, 0 when
/// the caller was not the holder.
pub(crate) static HOLD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] then
    redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
  end
  return 1
end
-- A replayed request finds its own mark (see the release script).
if ARGV[4] and redis.call('GET', KEYS[2]) == ARGV[4] then
  return 1
end
return 0
",
    )
});

/// KEYS: lock, fence, holds. ARGV: the most holds to return. Returns
/// `{holder, ms left, fencing token, kind}` for each hold, the one that
/// lasts longest first, or an empty array when the lock is free. For a
/// mutex the holder is the lock's value (owner token and holder
/// description), its token the counter's, and kind is `''`; for a
/// reader-writer lock or a semaphore, each live hold's member (owner
/// token, mode code) followed by its holder description, its own token
/// (both from `P:{E}:hw`, see `shared.rs`), and the name's marker.
pub(crate) static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = redis.call('GET', KEYS[1])
if not owner then
  return {}
end
local fence = redis.call('GET', KEYS[2]) or '0'
if string.sub(owner, 1, 1) ~= '~' then
  return {owner, tostring(redis.call('PTTL', KEYS[1])), fence, ''}
end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local live = redis.call('ZREVRANGEBYSCORE', KEYS[3], '+inf', '(' .. string.format('%.0f', us),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for i = 1, #live, 2 do
  local member, left = live[i], math.ceil((tonumber(live[i + 1]) - us) / 1000)
  local value = redis.call('HGET', KEYS[3] .. 'w', member) or ''
  local token, holder = string.match(value, '^(%d+)\031(.*)$')
  out[#out + 1] = member .. (holder or value)
  out[#out + 1] = string.format('%.0f', left)
  out[#out + 1] = token or fence
  out[#out + 1] = owner
end
return out
",
    )
});
