//! The scripts of the shared kinds of lock: reader-writer locks and
//! semaphores.
//!
//! A name held that way keeps a *marker* in its lock key (`~rw`, or `~s<N>`
//! for a semaphore of N), which expires with the last hold: a mutex's
//! `SET NX` fails on it as on any holder (and the mutex script reports the
//! kind), and a shared acquire finding another kind's marker, a mutex
//! holder's token or a mutex waiter refuses with the kind it found. The
//! holds are the sorted set `P:{E}:h` (member: owner token then mode code,
//! `r`, `w` or `p`; score: expiry in server µs, so that no rounding of the
//! clock to whole milliseconds ends a hold early), and each hold's fencing
//! token and holder description the hash `P:{E}:hw` (by member, the value
//! `<token>\x1f<description>`, a separator no description may hold;
//! beside the set, not in its members, whose layout older clients'
//! scripts read). Waiters share the
//! mutex's queue, with their mode code and marker in the hash `P:{E}:qm`;
//! a grant to a queued waiter leaves there, until the hold ends,
//! `^<member>` (the waiter and its place's score) and `>` then the waiter
//! (the member), so that the undo of a grant whose reply was lost gives
//! the waiter its place back.
//!
//! Every script takes the same keys: lock, fence, holds, queue, queue
//! expiry, queue modes, and on a cluster the release mark. Admission is
//! [`dlock_core::Mode::admits`]: a writer when nobody holds or waits ahead,
//! a reader when no writer holds or waits ahead, a permit when the holders
//! and the waiters ahead are fewer than the permits.

use redis::Script;

use super::{FENCE_RETENTION_MS, with_queue};

/// The helpers of the shared kinds, after the queue's.
const SHARED: &str = r"
-- The hash of the holds' tokens and holder descriptions, by member.
local function who(holds)
  return holds .. 'w'
end
-- Forgets the queue place `member`'s grant came from (see ACQUIRE);
-- returns its waiter and the place's score, if the waiter's last grant
-- was this one.
local function forget(qm, member)
  local kept = redis.call('HGET', qm, '^' .. member)
  if not kept then
    return nil
  end
  redis.call('HDEL', qm, '^' .. member)
  local to, since = string.match(kept, '^(%S+) (%S+)$')
  if to and redis.call('HGET', qm, '>' .. to) == member then
    redis.call('HDEL', qm, '>' .. to)
    return to, since
  end
  return nil
end
-- Drops the holds that ended, and the descriptions of up to 64 of them
-- (more, after a mass expiry, go with the hash when the name is idle),
-- and with `qm` the places their grants came from.
local function prune(holds, us, qm)
  local gone = redis.call('ZRANGEBYSCORE', holds, '-inf', us, 'LIMIT', 0, 64)
  if #gone > 0 then
    redis.call('HDEL', who(holds), unpack(gone))
    if qm then
      for _, m in ipairs(gone) do
        forget(qm, m)
      end
    end
  end
  redis.call('ZREMRANGEBYSCORE', holds, '-inf', us)
end
local function admits(mode, permits, count, writer, ahead, ahead_writer)
  if mode == 'w' then
    return count == 0 and ahead == 0
  elseif mode == 'r' then
    return not writer and not ahead_writer
  end
  return count + ahead < permits
end
-- The live holds of the name: how many, and whether a writer is among them
-- (a writer holds alone, or beside the one reader it downgraded to, so
-- only a set of two or fewer needs looking into).
local function holders(us)
  prune(KEYS[3], us, KEYS[6])
  local count, writer = redis.call('ZCARD', KEYS[3]), false
  if count <= 2 then
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if string.sub(m, 33) == 'w' then
        writer = true
      end
    end
  end
  return count, writer
end
-- A marker whose holds have all ended (it outlives the last by up to a
-- millisecond or two) is no marker: deletes it, and says whether it did.
local function stale(us)
  if redis.call('ZCOUNT', KEYS[3], '(' .. us, '+inf') == 0 then
    redis.call('DEL', KEYS[1])
    return true
  end
  return false
end
-- The marker (and the holds) expire with the hold that lasts longest;
-- `qm` as for `prune`.
local function settle(lock, holds, marker, us, qm)
  prune(holds, us, qm)
  local cur = redis.call('GET', lock)
  if cur and cur ~= marker then
    return
  end
  local last = redis.call('ZRANGE', holds, -1, -1, 'WITHSCORES')
  if last[1] then
    local at = math.ceil(tonumber(last[2]) / 1000)
    redis.call('SET', lock, marker)
    redis.call('PEXPIREAT', lock, at)
    redis.call('PEXPIREAT', holds, at)
    redis.call('PEXPIREAT', who(holds), at)
  else
    redis.call('DEL', who(holds))
    if cur then
      redis.call('DEL', lock)
    end
  end
end
-- Wakes the run of waiters at the head that would be admitted now: the
-- readers behind a writer together, as many permit waiters as permits
-- are free, one writer.
local function wake_run(marker, permits, count, writer, ms)
  local ahead, ahead_writer = 0, false
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    if tonumber(redis.call('ZSCORE', KEYS[5], w) or '0') > ms then
      local wm = redis.call('HGET', KEYS[6], w)
      if not wm or string.sub(wm, 2) ~= marker then
        -- Another kind's waiter is next only once the name is free.
        if count == 0 and ahead == 0 then
          wake(w)
        end
        return
      end
      local m = string.sub(wm, 1, 1)
      if not admits(m, permits, count, writer, ahead, ahead_writer) then
        return
      end
      wake(w)
      ahead = ahead + 1
      if m == 'w' then
        ahead_writer = true
      end
    end
  end
end
local function fence_up(us)
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  local fence = string.format('%.0f', math.max(last + 1, us))
  redis.call('SET', KEYS[2], fence, 'PX', FENCE_RETENTION)
  return fence
end
-- Grants `member` its token; returns the token.
local function describe(holds, member, us, holder)
  local fence = fence_up(us)
  redis.call('HSET', who(holds), member, fence .. '\031' .. holder)
  return fence
end
-- Forgets the queue place `member`'s grant came from (see ACQUIRE), or
-- gives it back to `waiter` where it was, live for `place` ms: the undo
-- of a grant whose reply was lost, to a waiter still waiting. Not when
-- the waiter left or was granted again since (its `>` field then names
-- no grant, or another).
local function give_back(member, waiter, place, marker, ms)
  local to, since = forget(KEYS[6], member)
  if not to or to ~= waiter then
    return
  end
  local at = redis.call('ZSCORE', KEYS[4], to)
  if not at or tonumber(at) > tonumber(since) then
    redis.call('ZADD', KEYS[4], since, to)
  end
  redis.call('ZADD', KEYS[5], ms + tonumber(place), to)
  redis.call('HSET', KEYS[6], to, string.sub(member, 33) .. marker)
  keep(KEYS[4], place)
  keep(KEYS[5], place)
  keep(KEYS[6], place)
end
";

/// ARGV: member (owner token and mode code), mode code, marker, permits,
/// TTL in ms, holder description, and to queue when not admitted: waiter,
/// place lifetime in ms. Returns `{1, fencing
/// token}` when granted, `{0, ms until the first hold ends}` when not
/// (`-2`: nobody holds), `{2, kind}` when the name is another kind of lock
/// (its marker, or `x` for a mutex).
const ACQUIRE: &str = r"
local member, mode, marker = ARGV[1], ARGV[2], ARGV[3]
local permits, ttl, me = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[7] or ''
local us = now_us()
local ms = math.floor(us / 1000)
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= marker then
  if string.sub(cur, 1, 1) ~= '~' then
    return {2, 'x'}
  elseif not stale(us) then
    return {2, cur}
  end
end
-- A replayed request (a cluster client's resend) finds its own grant, and
-- gets a token of its own, above every earlier one: the counter may have
-- moved on to other holders since the first run.
local mine = redis.call('ZSCORE', KEYS[3], member)
if mine and tonumber(mine) > us then
  return {1, describe(KEYS[3], member, us, ARGV[6])}
end
local count, writer = holders(us)
local ahead, ahead_writer = 0, false
head(KEYS[4], KEYS[5])
-- The waiters ahead, as far as they decide: a writer waits for any, a
-- reader for a writer, a permit for those that fill the free permits.
for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if w == me or (mode == 'w' and ahead > 0) or (mode == 'r' and ahead_writer)
    or (mode == 'p' and count + ahead >= permits) then
    break
  end
  if tonumber(redis.call('ZSCORE', KEYS[5], w) or '0') > ms then
    local wm = redis.call('HGET', KEYS[6], w)
    if not wm then
      return {2, 'x'}
    elseif string.sub(wm, 2) ~= marker then
      return {2, string.sub(wm, 2)}
    end
    ahead = ahead + 1
    if string.sub(wm, 1, 1) == 'w' then
      ahead_writer = true
    end
  end
end
if admits(mode, permits, count, writer, ahead, ahead_writer) then
  if me ~= '' then
    -- The grant remembers the place it came from, and the waiter which
    -- grant: if its reply is lost, the undo's release gives the place
    -- back (`give_back`). Sent to the back, the waiter would queue behind
    -- a writer that came later, which waits for the readers let in
    -- beside it, while they wait for this reader.
    -- A grant before this one (its reply lost, its undo still to come)
    -- has no place to give back now.
    local prev = redis.call('HGET', KEYS[6], '>' .. me)
    if prev then
      redis.call('HDEL', KEYS[6], '^' .. prev, '>' .. me)
    end
    local since = redis.call('ZSCORE', KEYS[4], me)
    if since then
      redis.call('HSET', KEYS[6], '^' .. member, me .. ' ' .. since, '>' .. me, member)
    end
    redis.call('ZREM', KEYS[4], me)
    redis.call('ZREM', KEYS[5], me)
    redis.call('HDEL', KEYS[6], me)
    if since then
      keep(KEYS[6], ARGV[8])
    end
  end
  redis.call('ZADD', KEYS[3], us + ttl * 1000, member)
  local fence = describe(KEYS[3], member, us, ARGV[6])
  settle(KEYS[1], KEYS[3], marker, us, KEYS[6])
  return {1, fence}
end
if me ~= '' then
  if not redis.call('ZSCORE', KEYS[4], me) then
    redis.call('ZADD', KEYS[4], us, me)
  end
  redis.call('ZADD', KEYS[5], ms + tonumber(ARGV[8]), me)
  redis.call('HSET', KEYS[6], me, mode .. marker)
  keep(KEYS[4], ARGV[8])
  keep(KEYS[5], ARGV[8])
  keep(KEYS[6], ARGV[8])
end
if count == 0 then
  -- Free, but promised to waiters ahead that may have missed their call.
  wake_run(marker, permits, 0, false, ms)
  return {0, '-2'}
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2]
return {0, string.format('%.0f', math.ceil((tonumber(first) - us) / 1000))}
";

/// ARGV: member (owner token and mode code), marker, permits, the waiter
/// to give the grant's place back to (`give_back`; empty: none) and its
/// place lifetime in ms, and on a cluster the request's id and how long
/// to remember it in ms. Returns 1 when released, 0 when the hold was not
/// live.
const RELEASE: &str = r"
local us = now_us()
local ms = math.floor(us / 1000)
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if score and tonumber(score) > us then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', who(KEYS[3]), ARGV[1])
  give_back(ARGV[1], ARGV[4], ARGV[5], ARGV[2], ms)
  settle(KEYS[1], KEYS[3], ARGV[2], us, KEYS[6])
  local count, writer = holders(us)
  wake_run(ARGV[2], tonumber(ARGV[3]), count, writer, ms)
  if ARGV[6] then
    redis.call('SET', KEYS[7], ARGV[6], 'PX', ARGV[7])
  end
  return 1
end
if ARGV[6] and redis.call('GET', KEYS[7]) == ARGV[6] then
  return 1
end
return 0
";

/// ARGV: member, the hold's member, hold in ms, marker, and on a cluster
/// the request's id and how long to remember it in ms. Returns 1 when the
/// hold is set, 0 when the hold was not live.
const HOLD: &str = r"
local us = now_us()
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if score and tonumber(score) > us then
  redis.call('ZREM', KEYS[3], ARGV[1])
  forget(KEYS[6], ARGV[1])
  redis.call('ZADD', KEYS[3], us + tonumber(ARGV[3]) * 1000, ARGV[2])
  -- The hold keeps the token and description, for operators.
  local holder = redis.call('HGET', who(KEYS[3]), ARGV[1])
  if holder then
    redis.call('HDEL', who(KEYS[3]), ARGV[1])
    redis.call('HSET', who(KEYS[3]), ARGV[2], holder)
  end
  settle(KEYS[1], KEYS[3], ARGV[4], us, KEYS[6])
  if ARGV[5] then
    redis.call('SET', KEYS[7], ARGV[5], 'PX', ARGV[6])
  end
  return 1
end
if ARGV[5] and redis.call('GET', KEYS[7]) == ARGV[5] then
  return 1
end
return 0
";

/// ARGV: the writer's member, the reader's member, TTL in ms, marker, the
/// reader's holder description.
/// Returns `{1, fencing token}`, or `{0, ''}` when the write hold is not
/// live.
const DOWNGRADE: &str = r"
local us = now_us()
local score = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not score or tonumber(score) <= us then
  return {0, ''}
end
redis.call('ZADD', KEYS[3], us + tonumber(ARGV[3]) * 1000, ARGV[2])
local fence = describe(KEYS[3], ARGV[2], us, ARGV[5])
settle(KEYS[1], KEYS[3], ARGV[4], us, KEYS[6])
return {1, fence}
";

/// ARGV: waiter, marker, permits. Gives the waiter's place up and wakes
/// whoever that lets in.
const ABANDON: &str = r"
local us = now_us()
local ms = math.floor(us / 1000)
-- A grant of unknown outcome cannot give the place back after this.
local granted = redis.call('HGET', KEYS[6], '>' .. ARGV[1])
if granted then
  redis.call('HDEL', KEYS[6], '^' .. granted, '>' .. ARGV[1])
end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
local count, writer = holders(us)
wake_run(ARGV[2], tonumber(ARGV[3]), count, writer, ms)
return 1
";

/// ARGV: marker, permits. Ends every hold of the name (an operator's
/// force release) and wakes the waiters, if the name is still held as
/// `marker`. Returns how many holds it ended.
const CLEAR: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local us = now_us()
local ms = math.floor(us / 1000)
local count = holders(us)
for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  forget(KEYS[6], m)
end
redis.call('DEL', KEYS[3], who(KEYS[3]))
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
wake_run(ARGV[1], tonumber(ARGV[2]), 0, false, ms)
return count
";

/// KEYS: lock, fence and holds of each lease in turn. ARGV: fence retention
/// in ms, then member, TTL in ms and marker of each lease. Returns one 1
/// (extended) or 0 (not live) per lease.
const EXTEND: &str = r"
local us = now_us()
local out = {}
for i = 1, #KEYS / 3 do
  local lock, fence, holds = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local member, ttl, marker = ARGV[3 * i - 1], tonumber(ARGV[3 * i]), ARGV[3 * i + 1]
  local score = redis.call('ZSCORE', holds, member)
  if score and tonumber(score) > us then
    redis.call('ZADD', holds, us + ttl * 1000, member)
    settle(lock, holds, marker, us)
    redis.call('PEXPIRE', fence, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// The shared kinds' scripts, in the flavour of one deployment's wake-ups.
pub(crate) struct SharedScripts {
    pub acquire: Script,
    pub release: Script,
    pub hold: Script,
    pub downgrade: Script,
    pub abandon: Script,
    pub clear: Script,
    pub extend: Script,
}

impl SharedScripts {
    pub(super) fn new(wake: &str) -> Self {
        let prelude = format!(
            "{wake}{}",
            SHARED.replace("FENCE_RETENTION", &FENCE_RETENTION_MS.to_string())
        );
        let script = |body: &str| with_queue(&format!("{prelude}{body}"), "");
        SharedScripts {
            acquire: script(ACQUIRE),
            release: script(RELEASE),
            hold: script(HOLD),
            downgrade: script(DOWNGRADE),
            abandon: script(ABANDON),
            clear: script(CLEAR),
            extend: script(EXTEND),
        }
    }
}
