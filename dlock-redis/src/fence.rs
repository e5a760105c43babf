//! Fenced writes to Redis: the resource's side of fencing, for data the
//! application keeps in Redis (whatever backend its locks are on). One
//! script compares the writer's token with the greatest one the key has
//! seen, kept beside it, and writes only when the writer's is not lower:
//! check and write are one step, so no older holder slips in between.
//!
//! The token is kept beside the key, in its hash slot: `<key>:fence` for a
//! key with a hash tag, `{<key>}:untagged-fence` for one without. It has no
//! expiry, and must not be evicted either: dropping it would let an older
//! holder write again. Keep fenced data on a server whose
//! `maxmemory-policy` is `noeviction`, or `volatile-*` with no expiry on
//! these keys.

use std::sync::LazyLock;
use std::time::Duration;

use dlock_core::{Error, Result, check_fence};
use redis::Script;
use redis::aio::ConnectionLike;

use crate::backend::NAME;
use crate::error::redis_error;

/// KEYS: the data key, its fence. ARGV: token, value, and for a hash write
/// the field. Tokens are compared as decimal text, digit for digit, so that
/// any `u64` compares exactly. Returns `{1, token}` when written, `{0,
/// greatest}` when refused.
static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local highest = redis.call('GET', KEYS[2])
local mine = ARGV[1]
if highest and (#highest > #mine or (#highest == #mine and highest > mine)) then
  return {0, highest}
end
-- The data first: a write that fails (a key of another type) must leave
-- the fence as it was, since a script's earlier writes stay.
if ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
redis.call('SET', KEYS[2], mine)
return {1, mine}
",
    )
});

/// Fenced `SET` and `HSET`, each one script run bounded by a timeout.
///
/// ```no_run
/// # async fn f(mut conn: redis::aio::MultiplexedConnection, guard: dlock_core::Guard) -> dlock_core::Result<()> {
/// use dlock_redis::fence::RedisFence;
/// # use dlock_redis::redis;
/// let fence = RedisFence::new();
/// fence.set(&mut conn, "report:today", b"...", guard.fencing_token()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisFence {
    timeout: Duration,
}

impl Default for RedisFence {
    fn default() -> Self {
        RedisFence {
            timeout: Duration::from_secs(1),
        }
    }
}

impl RedisFence {
    /// Writes bounded by 1 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a write may take (default 1 s). A write that times out may
    /// still have been made.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `SET key value`, unless `key` has seen a greater token than `token`.
    ///
    /// # Errors
    /// [`Error::Fenced`] for a stale token (nothing written); the server's.
    pub async fn set(
        &self,
        conn: &mut impl ConnectionLike,
        key: &str,
        value: &[u8],
        token: u64,
    ) -> Result<()> {
        self.write(conn, key, None, value, token).await
    }

    /// `HSET key field value`, unless `key` has seen a greater token than
    /// `token` (one fence for the whole hash).
    ///
    /// # Errors
    /// [`Error::Fenced`] for a stale token (nothing written); the server's.
    pub async fn hset(
        &self,
        conn: &mut impl ConnectionLike,
        key: &str,
        field: &str,
        value: &[u8],
        token: u64,
    ) -> Result<()> {
        self.write(conn, key, Some(field), value, token).await
    }

    async fn write(
        &self,
        conn: &mut impl ConnectionLike,
        key: &str,
        field: Option<&str>,
        value: &[u8],
        token: u64,
    ) -> Result<()> {
        let mut invocation = FENCED_WRITE.prepare_invoke();
        invocation
            .key(key)
            .key(fence_key(key))
            .arg(token.to_string())
            .arg(value);
        if let Some(field) = field {
            invocation.arg(field);
        }
        let run = invocation.invoke_async::<(u8, String)>(conn);
        let (written, highest) = match tokio::time::timeout(self.timeout, run).await {
            Ok(done) => done.map_err(|e| redis_error(e, "fenced write"))?,
            Err(_) => {
                return Err(Error::timed_out(
                    NAME,
                    format!("fenced write: no answer within {:?}", self.timeout),
                ));
            }
        };
        if written == 1 {
            return Ok(());
        }
        // A token the script refused is one it read as greater.
        let highest = highest.parse().unwrap_or(u64::MAX);
        check_fence(key, token, Some(highest))
    }
}

/// Where `key`'s token is kept: in its hash slot, so that a cluster runs
/// the script on the node that holds both. A key with a hash tag keeps it
/// in `<key>:fence`; one without, in `{<key>}:untagged-fence`, whose tag is
/// the key (a name no tagged key's fence can have). A key with a `}` but
/// no tag cannot be matched so: its fence may land in another slot, which
/// only a cluster refuses.
fn fence_key(key: &str) -> String {
    let tagged = key
        .split_once('{')
        .and_then(|(_, rest)| rest.find('}'))
        .is_some_and(|end| end > 0);
    if tagged || key.contains('}') {
        format!("{key}:fence")
    } else {
        format!("{{{key}}}:untagged-fence")
    }
}

#[cfg(test)]
mod tests {
    use super::fence_key;

    #[test]
    fn the_fence_shares_the_keys_slot() {
        assert_eq!(fence_key("report"), "{report}:untagged-fence");
        assert_eq!(fence_key("{report}"), "{report}:fence");
        assert_eq!(fence_key("user:{7}:cart"), "user:{7}:cart:fence");
        // An empty tag is no tag, and no fence name shares the whole
        // key's slot: its own (see above).
        assert_eq!(fence_key("a{}b"), "a{}b:fence");
    }
}
