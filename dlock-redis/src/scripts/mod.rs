//! The Lua scripts. A mutex's *lock value* is its owner token followed by
//! its holder description ([`crate::keys::value`]): the scripts compare
//! it whole, so only the grant's own lease matches. Each runs by SHA; the redis crate loads it again only
//! when the server answers NOSCRIPT (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

mod lease;
mod shared;

pub(crate) use lease::{EXTEND, EXTEND_MANY, HOLD, HOLDERS};
pub(crate) use shared::SharedScripts;

/// How long the fencing counter outlives the last grant or extension.
/// Tokens are never below the server's clock in microseconds, so once the
/// counter is gone (expired, or lost in a restart without persistence) the
/// clock alone keeps the next token above every earlier one. The retention
/// only has to cover the server's clock stepping back.
pub(crate) const FENCE_RETENTION_MS: u64 = 60 * 60 * 1000;

/// How long a queued waiter keeps its place without asking again, in
/// multiples of its heartbeat (the longest a waiter sleeps between attempts).
pub(crate) const PLACE_HEARTBEATS: u32 = 3;

/// The waiter queue, shared by the scripts below. `q` holds waiters by
/// arrival (score: server time in µs), `qexp` when each one's place lapses
/// (score: server time in ms). A waiter is `<32 hex digits><client id>`,
/// and its client hears wake-ups on `<prefix>:wake:<client id>`, with the
/// lock's key as the message. When nobody waits (the common case) acquire
/// and release cost one `EXISTS` on a missing key more than a bare lock
/// (their fast paths).
const QUEUE: &str = r"
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The first waiter whose place has not lapsed, and whether it just became
-- first (lapsed places ahead of it were dropped: nobody has woken it).
-- Lapsed places at the front are all dropped, however many: a bound here
-- would hide a live head behind them (and promise a free lock to nobody),
-- and each place is dropped once, so the work is bounded by the places
-- ever queued. A few lapsed places further back are dropped per call too.
-- `qv`, when given, loses the dropped waiters' lock values as well.
local function head(q, qexp, qv)
  local first = redis.call('ZRANGE', q, 0, 0)[1]
  if not first then
    return nil, false
  end
  local was = first
  local ms = math.floor(now_us() / 1000)
  local gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', ms, 'LIMIT', 0, 16)
  if #gone > 0 then
    redis.call('ZREM', q, unpack(gone))
    redis.call('ZREM', qexp, unpack(gone))
    if qv then
      redis.call('HDEL', qv, unpack(gone))
    end
    first = redis.call('ZRANGE', q, 0, 0)[1]
  end
  while first and tonumber(redis.call('ZSCORE', qexp, first) or '0') <= ms do
    redis.call('ZREM', q, first)
    redis.call('ZREM', qexp, first)
    if qv then
      redis.call('HDEL', qv, first)
    end
    first = redis.call('ZRANGE', q, 0, 0)[1]
  end
  return first, first ~= was
end
-- The queue keys live as long as the longest-lived place in them.
local function keep(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
";

/// How a waiter's client is woken on one server: on its one channel,
/// `<prefix>:wake:<client id>`. The prefix is what precedes the hash tag
/// (prefixes have no braces).
const WAKE: &str = r"
local function notify(waiter, message)
  local prefix = string.match(KEYS[1], '^(.-):{')
  -- pcall: a client whose ACL lacks channel rights (Redis 7's default
  -- for new users) must still release and queue; its waiters poll.
  return redis.pcall('PUBLISH', prefix .. ':wake:' .. string.sub(waiter, 33), message)
end
local function wake(waiter)
  if waiter then
    notify(waiter, KEYS[1])
  end
end
";

/// How a waiter's client is woken on a cluster: a sharded channel per lock
/// and client, `<lock key>:wake:<client id>`, in the lock's slot, so the
/// message stays on the node that holds the lock.
const WAKE_SHARDED: &str = r"
local function notify(waiter, message)
  return redis.pcall('SPUBLISH', KEYS[1] .. ':wake:' .. string.sub(waiter, 33), message)
end
local function wake(waiter)
  if waiter then
    notify(waiter, KEYS[1])
  end
end
";

fn with_queue(body: &str, wake: &str) -> Script {
    with_fast_path("", body, wake)
}

/// A script whose `fast` path, for a name nobody queues on (the common
/// case), runs before the queue's functions are even defined: making
/// them costs each run about as much as a command.
fn with_fast_path(fast: &str, body: &str, wake: &str) -> Script {
    Script::new(&format!("{fast}{QUEUE}{wake}{body}"))
}

/// Draws the next fencing token into `fence`, the counter `KEYS[2]`, kept
/// for [`FENCE_RETENTION_MS`]: never below the last one plus one, nor
/// below the server's clock in µs.
///
/// The clock's µs are joined as text, and the counter is swapped in one
/// `SET … GET`: formatting a number, and a `GET` of its own, each cost the
/// server about as much as the rest of the draw. Only when the last token
/// is not below the clock (it stepped back, or two grants fell in one µs)
/// is a number formatted: the last one plus one. (Tokens stay below 2^53,
/// where Lua's numbers are exact, until the 2250s.)
static FENCE_DRAW: LazyLock<String> = LazyLock::new(|| {
    format!(
        r"
  local t = redis.call('TIME')
  local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  local last = redis.call('SET', KEYS[2], fence, 'PX', {FENCE_RETENTION_MS}, 'GET')
  if last and tonumber(last) >= tonumber(fence) then
    fence = string.format('%.0f', tonumber(last) + 1)
    redis.call('SET', KEYS[2], fence, 'PX', {FENCE_RETENTION_MS})
  end
"
    )
});

/// The acquire script's keys, filled in from the lock key when that is
/// the only one sent: every key sent costs one server about what a small
/// command does. (A lock's keys are its lock key and a suffix, in one hash
/// slot, see [`crate::keys`].) A cluster is sent them all: a slot being
/// migrated answers `TRYAGAIN` or `ASK` for the keys a script declares,
/// and fails a script that touches a key it did not declare.
const ACQUIRE_KEYS: &str = r"
if not KEYS[2] then
  KEYS[2], KEYS[3], KEYS[4], KEYS[5] = KEYS[1] .. ':fence', KEYS[1] .. ':q', KEYS[1] .. ':qexp', KEYS[1] .. ':qv'
end
";

/// As [`ACQUIRE_KEYS`], for the release.
const RELEASE_KEYS: &str = r"
if not KEYS[2] then
  KEYS[2], KEYS[3], KEYS[4], KEYS[5] = KEYS[1] .. ':q', KEYS[1] .. ':qexp', KEYS[1] .. ':fence', KEYS[1] .. ':qv'
end
";

/// The scripts that wake waiters, in the flavour of one deployment.
pub(crate) struct QueueScripts {
    pub acquire: Script,
    pub release: Script,
    pub abandon: Script,
    /// The reader-writer lock's and the semaphore's.
    pub shared: SharedScripts,
}

impl QueueScripts {
    fn new(wake: &str) -> Self {
        QueueScripts {
            acquire: with_fast_path(
                &format!("{ACQUIRE_KEYS}{}", *ACQUIRE_FAST),
                &ACQUIRE_BODY,
                wake,
            ),
            release: with_fast_path(
                &format!("{RELEASE_KEYS}{RELEASE_FAST}"),
                &format!("{}{RELEASE_BODY}", *HAND_OVER),
                wake,
            ),
            abandon: with_queue(ABANDON_BODY, wake),
            shared: SharedScripts::new(wake),
        }
    }
}

/// For one server (or Sentinel's primary).
pub(crate) static SINGLE: LazyLock<QueueScripts> = LazyLock::new(|| QueueScripts::new(WAKE));

/// For Redis Cluster: sharded pub/sub.
pub(crate) static SHARDED: LazyLock<QueueScripts> =
    LazyLock::new(|| QueueScripts::new(WAKE_SHARDED));

/// KEYS: lock, fence, queue, queue expiry, queue values (or the lock
/// alone, see [`ACQUIRE_KEYS`]). ARGV: lock value, TTL in ms, and to queue
/// when held: waiter, place lifetime in ms, and for a waiter that takes a
/// grant from a release's message, the number of this attempt in its wait.
/// Returns the fencing token alone when granted now (the common reply,
/// and a table costs the server more than a string), `{3, fencing token,
/// PTTL}` when the lock value was granted before (a replayed request, an
/// earlier attempt of the same wait, or a release's hand-over), `{0, holder's
/// PTTL}` when held (-2: free, but promised to the waiter at the head of
/// the queue), `{2, marker}` when the name is held as a reader-writer lock
/// or a semaphore (see `shared.rs`).
///
/// A free lock goes to the head of the queue, or to anyone when nobody
/// waits; a waiter not granted joins the queue (once) and renews its place.
/// A waiter that takes hand-overs also leaves, under its place, its lock
/// value, its TTL, when it last asked and that attempt's number
/// ([`HAND_OVER`]).
static ACQUIRE_BODY: LazyLock<String> = LazyLock::new(|| {
    format!(
        r"
local me = ARGV[3] or ''
local first, promoted = head(KEYS[3], KEYS[4], KEYS[5])
if (not first or first == me) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- The grantee's place goes on every grant, not only when it was first:
  -- left behind, it would become the head once the lock is free again.
  if me ~= '' then
    redis.call('ZREM', KEYS[3], me)
    redis.call('ZREM', KEYS[4], me)
    redis.call('HDEL', KEYS[5], me)
  end
{fence_draw}
  return fence
end
-- A replayed request (the cluster client sends a request again when its
-- connection failed, and the first may have run) finds its own grant.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local fence = redis.call('GET', KEYS[2])
  if not fence then
    -- The counter is gone (evicted, deleted): the clock still gives a
    -- token above every earlier one.
    fence = string.format('%.0f', now_us())
    redis.call('SET', KEYS[2], fence, 'PX', {FENCE_RETENTION_MS})
  end
  return {{3, fence, tostring(redis.call('PTTL', KEYS[1]))}}
end
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 1) == '~' then
  -- A reader-writer lock's or semaphore's marker (`P:{{E}}:h` holds its
  -- holds, in this slot). It outlives the last hold by a millisecond or
  -- two: stale, it goes, and the name counts as free but not yet taken.
  local live = '(' .. string.format('%.0f', now_us())
  if redis.call('ZCOUNT', KEYS[1] .. ':h', live, '+inf') > 0 then
    return {{2, holder}}
  end
  redis.call('DEL', KEYS[1])
end
if me ~= '' then
  local us = now_us()
  if not redis.call('ZSCORE', KEYS[3], me) then
    redis.call('ZADD', KEYS[3], us, me)
  end
  redis.call('ZADD', KEYS[4], math.floor(us / 1000) + tonumber(ARGV[4]), me)
  keep(KEYS[3], ARGV[4])
  keep(KEYS[4], ARGV[4])
  if ARGV[5] then
    redis.call('HSET', KEYS[5], me, ARGV[2] .. ':' .. math.floor(us / 1000) .. ':' .. ARGV[5] .. ':' .. ARGV[1])
    keep(KEYS[5], ARGV[4])
  end
end
local pttl = redis.call('PTTL', KEYS[1])
-- Free but promised to a head that lapsed places were hiding: nobody has
-- woken it yet. (A head woken by the release needs no second message, one
-- that saw the lock held looks again when that lease ends, and one whose
-- wake-up was lost looks again at its next heartbeat.)
if pttl == -2 and promoted and first ~= me then
  wake(first)
end
return {{0, tostring(pttl)}}
",
        fence_draw = *FENCE_DRAW,
    )
});

/// ACQUIRE when nobody queues on the name: granted if free, else on to the
/// whole script.
static ACQUIRE_FAST: LazyLock<String> = LazyLock::new(|| {
    format!(
        r"
if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
{fence_draw}
  return fence
end
",
        fence_draw = *FENCE_DRAW,
    )
});

/// RELEASE when nobody queues on the name, so nobody is to be woken:
/// released if ours, else on to the whole script (which finds a replay).
const RELEASE_FAST: &str = r"
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] then
    redis.call('SET', KEYS[6], ARGV[2], 'PX', ARGV[3])
  end
  return 1
end
";

/// Hands a free lock (`KEYS[1]`, its fence `KEYS[4]`, queue values
/// `KEYS[5]`) over to the head of the queue, `first`, in the release that
/// freed it: the head learns of its grant from the message alone, one push
/// instead of a wake-up and an acquire. Only a head that left its lock
/// value gets it, only if it asked within the last half of its TTL (the
/// grant expires its TTL after that ask, by the server's clock, and the
/// waiter counts its validity from when it sent that ask, whose number
/// the message carries: before the server ran it), and only if its
/// client's connection hears
/// the message: the client of a waiter whose process died has no
/// connection left, and its place lapses as before instead of the lock
/// being held for a TTL by nobody. (The message then tells no one.) Any
/// other head is woken as before.
///
/// The message is `+<fencing token> <waiter> <attempt> <owner token> <lock
/// key>`.
static HAND_OVER: LazyLock<String> = LazyLock::new(|| {
    format!(
        r"
local function hand_over(first)
  if not first then
    return
  end
  local stored = redis.call('HGET', KEYS[5], first)
  local ttl, asked, attempt, value
  if stored then
    ttl, asked, attempt, value = string.match(stored, '^(%d+):(%d+):(%d+):(.*)$')
  end
  if value then
    local ms = math.floor(now_us() / 1000)
    local left = tonumber(ttl) - (ms - tonumber(asked))
    if left * 2 >= tonumber(ttl) then
      local last = tonumber(redis.call('GET', KEYS[4]) or '0')
      local fence = string.format('%.0f', math.max(last + 1, now_us()))
      redis.call('SET', KEYS[4], fence, 'PX', {FENCE_RETENTION_MS})
      local heard = notify(first, '+' .. fence .. ' ' .. first .. ' ' .. attempt .. ' '
        .. string.sub(value, 1, 32) .. ' ' .. KEYS[1])
      if type(heard) == 'number' and heard > 0 then
        redis.call('SET', KEYS[1], value, 'PX', left)
        redis.call('ZREM', KEYS[2], first)
        redis.call('ZREM', KEYS[3], first)
        redis.call('HDEL', KEYS[5], first)
      end
      return
    end
  end
  wake(first)
end
"
    )
});

/// KEYS: lock, queue, queue expiry, fence, queue values, and on a cluster
/// the release mark (on one server the lock alone, see [`RELEASE_KEYS`]).
/// ARGV: lock value, and on a cluster the request's id and how long to
/// remember it in ms. Returns 1 when released, 0 when the caller was not
/// the holder. Hands the lock over to the head of the queue (or wakes it):
/// one message per release, however many wait.
const RELEASE_BODY: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  hand_over(head(KEYS[2], KEYS[3], KEYS[5]))
  if ARGV[2] then
    redis.call('SET', KEYS[6], ARGV[2], 'PX', ARGV[3])
  end
  return 1
end
-- A replayed request (the cluster client sends a request again when its
-- connection dropped, and the first may have run) finds its own mark.
if ARGV[2] and redis.call('GET', KEYS[6]) == ARGV[2] then
  return 1
end
return 0
";

/// KEYS: lock, queue, queue expiry, queue values. ARGV: waiter, and the
/// lock value of a waiter that takes hand-overs.
/// A waiter gives up its place, and a grant handed over to it that it
/// never took; if it was first, or gave a grant up, or lapsed places were
/// hiding the head, and the lock is free, the next one is woken.
const ABANDON_BODY: &str = r"
local first, promoted = head(KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if ARGV[2] and redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  first = ARGV[1]
end
if (first == ARGV[1] or promoted) and redis.call('EXISTS', KEYS[1]) == 0 then
  wake(head(KEYS[2], KEYS[3], KEYS[4]))
end
return 1
";
