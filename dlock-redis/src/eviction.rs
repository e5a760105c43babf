//! Refusing a server that may evict lock keys.
//!
//! A lock is a key with an expiry. Under every `maxmemory-policy` but
//! `noeviction`, Redis deletes keys when memory runs short — `volatile-ttl`
//! the shortest-lived first, which are lock keys — and another client's
//! `SET NX` then succeeds while the first lease is still valid. So the
//! driver reads the policy on every connection it opens to a primary (at
//! connect, and after a Sentinel failover) and refuses anything else,
//! unless the builder was told to accept the risk.

use dlock_core::{Error, Result};
use redis::Value;
use redis::aio::ConnectionLike;

use crate::backend::NAME;
use crate::error::redis_error;

/// The only policy under which Redis never deletes a live key.
const SAFE: &str = "noeviction";

/// Reads `maxmemory_policy` from `INFO memory` (which, unlike `CONFIG GET`,
/// managed services leave enabled) on `conn`; on a cluster connection the
/// reply holds every primary's, and each must be safe.
pub(crate) async fn check(
    conn: &mut impl ConnectionLike,
    bound: std::time::Duration,
) -> Result<()> {
    let info = redis::cmd("INFO").arg("memory").to_owned();
    let reply = match tokio::time::timeout(bound, conn.req_packed_command(&info)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => {
            return Err(unsafe_server(format!(
                "cannot read maxmemory-policy ({}); allow INFO, or accept the risk of \
                 evicted locks with accept_eviction_risk(true)",
                redis_error(e, "INFO memory")
            )));
        }
        Err(_) => {
            return Err(Error::connection(
                NAME,
                "read maxmemory-policy",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
    };
    let mut policies = Vec::new();
    collect_policies(&reply, &mut policies);
    if policies.is_empty() {
        return Err(Error::malformed(NAME, "INFO memory", reply));
    }
    match policies.iter().find(|p| p.as_str() != SAFE) {
        Some(policy) => Err(unsafe_server(format!(
            "maxmemory-policy is {policy}: Redis may evict held locks under memory pressure \
             and grant them again; set it to {SAFE}, or accept the risk with \
             accept_eviction_risk(true)"
        ))),
        None => Ok(()),
    }
}

fn unsafe_server(message: String) -> Error {
    Error::UnsafeServer {
        backend: NAME,
        message,
    }
}

/// Every `maxmemory_policy:` line in a reply, whatever its shape (one
/// server's text, or a cluster's map of node to text).
fn collect_policies(reply: &Value, out: &mut Vec<String>) {
    match reply {
        Value::BulkString(bytes) => collect_from_text(&String::from_utf8_lossy(bytes), out),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => {
            collect_from_text(text, out);
        }
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| collect_policies(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_policies(v, out)),
        _ => {}
    }
}

fn collect_from_text(text: &str, out: &mut Vec<String>) {
    out.extend(
        text.lines()
            .filter_map(|line| line.strip_prefix("maxmemory_policy:"))
            .map(|policy| policy.trim().to_owned()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_read_from_one_server_or_many() {
        let one = Value::BulkString(
            b"# Memory\r\nused_memory:1\r\nmaxmemory_policy:noeviction\r\n".to_vec(),
        );
        let mut found = Vec::new();
        collect_policies(&one, &mut found);
        assert_eq!(found, ["noeviction"]);
        let many = Value::Map(vec![
            (Value::SimpleString("a:1".into()), one),
            (
                Value::SimpleString("b:2".into()),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: "maxmemory_policy:volatile-ttl\r\n".into(),
                },
            ),
        ]);
        found.clear();
        collect_policies(&many, &mut found);
        assert_eq!(found, ["noeviction", "volatile-ttl"]);
    }
}
