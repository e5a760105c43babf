//! Refusing a server that may evict lock keys.
//!
//! A lock is a key with an expiry. Under every `maxmemory-policy` but
//! `noeviction`, Redis deletes keys when memory runs short — `volatile-ttl`
//! the shortest-lived first, which are lock keys — and another client's
//! `SET NX` then succeeds while the first lease is still valid. So the
//! driver reads the policy on every connection it opens to a primary (at
//! connect, and after a Sentinel failover) and refuses anything else,
//! unless the builder was told to accept the risk. Not checked: a policy
//! changed at run time, and a Redis Cluster primary that joins or is
//! promoted after connect.

use dlock_core::{Error, Result};
use redis::Value;
use redis::aio::ConnectionLike;

use crate::backend::NAME;
use crate::error::redis_error;

/// The only policy under which Redis never deletes a live key.
const SAFE: &str = "noeviction";

/// Reads `maxmemory_policy` from `INFO memory` (which, unlike `CONFIG GET`,
/// managed services leave enabled) on `conn`; on a cluster connection the
/// reply is a map with every primary's, and each must be there and safe.
pub(crate) async fn check(
    conn: &mut impl ConnectionLike,
    bound: std::time::Duration,
) -> Result<()> {
    let info = redis::cmd("INFO").arg("memory").to_owned();
    let reply = match tokio::time::timeout(bound, conn.req_packed_command(&info)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) if e.code() == Some("NOPERM") => return Err(cannot_read(&e.to_string())),
        // Transport trouble is what it is (retryable), not a verdict on
        // the server's configuration.
        Ok(Err(e)) => return Err(redis_error(e, "read maxmemory-policy")),
        Err(_) => return Err(Error::timed_out(NAME, "read maxmemory-policy")),
    };
    let servers: Vec<&Value> = match &reply {
        Value::Map(nodes) => nodes.iter().map(|(_, v)| v).collect(),
        one => vec![one],
    };
    for server in servers {
        let policy = match server {
            Value::BulkString(bytes) => policy_in(&String::from_utf8_lossy(bytes)),
            Value::SimpleString(text) | Value::VerbatimString { text, .. } => policy_in(text),
            // A node that answered NOPERM, LOADING, ...: unchecked is unsafe.
            Value::ServerError(e) => return Err(cannot_read(&format!("{e:?}"))),
            other => return Err(Error::malformed(NAME, "INFO memory", other)),
        };
        match policy {
            Some(policy) if policy == SAFE => {}
            Some(policy) => {
                return Err(unsafe_server(format!(
                    "maxmemory-policy is {policy}: Redis may evict held locks under memory \
                     pressure and grant them again; set it to {SAFE}, or accept the risk with \
                     accept_eviction_risk(true)"
                )));
            }
            None => return Err(Error::malformed(NAME, "INFO memory", server)),
        }
    }
    Ok(())
}

fn cannot_read(why: &str) -> Error {
    unsafe_server(format!(
        "cannot read maxmemory-policy ({why}); allow INFO, or accept the risk of evicted \
         locks with accept_eviction_risk(true)"
    ))
}

fn unsafe_server(message: String) -> Error {
    Error::UnsafeServer {
        backend: NAME,
        message,
    }
}

/// The `maxmemory_policy:` line of one server's `INFO memory`.
fn policy_in(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(|policy| policy.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_from_info_text() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:noeviction\r\n";
        assert_eq!(policy_in(info).as_deref(), Some("noeviction"));
        assert_eq!(policy_in("used_memory:1\r\n"), None);
    }
}
