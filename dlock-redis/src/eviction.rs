//! Refusing a server that may evict lock keys.
//!
//! A lock is a key with an expiry. Under every `maxmemory-policy` but
//! `noeviction`, Redis deletes keys when memory runs short — `volatile-ttl`
//! the shortest-lived first, which are lock keys — and another client's
//! `SET NX` then succeeds while the first lease is still valid. So the
//! driver reads the policy on every connection it opens to a primary (at
//! connect, and after a Sentinel failover) and refuses anything else,
//! unless the builder was told to accept the risk; and it reads it again
//! every [`RECHECK`] (every primary of a cluster, those promoted or added
//! since included): a server set to evict at run time ends the trust of
//! every lease granted before, and refuses calls until it is safe again.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use dlock_core::{Error, Lease, Result};
use redis::Value;
use redis::aio::ConnectionLike;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::backend::{NAME, RedisBackend};
use crate::error::redis_error;

/// How often a connected backend reads its servers' policy again.
const RECHECK: Duration = Duration::from_secs(5);

/// What a backend believes of its servers' policy since connect.
#[derive(Default)]
pub(crate) struct Trust {
    /// The parent of every granted lease's lost token, cancelled (and
    /// replaced) when a server is found evicting.
    token: RwLock<CancellationToken>,
    /// Why calls are refused, while a server is found evicting.
    refusal: Mutex<Option<String>>,
}

impl Trust {
    /// The token a lease granted from now on is trusted while.
    pub fn token(&self) -> CancellationToken {
        self.token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The error every grant and extension gets while a server is found
    /// evicting.
    pub fn refusal(&self) -> Option<Error> {
        let refusal = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        refusal.clone().map(unsafe_server)
    }

    /// The error for a lease whose trust ended that way.
    pub fn lost(lease: &Lease) -> Error {
        unsafe_server(format!(
            "{:?} was held when a server was found set to evict keys: its lock may have \
             been evicted and granted again",
            lease.name()
        ))
    }

    pub fn distrust(&self, message: String) {
        let mut refusal = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        if refusal.is_none() {
            tracing::error!(%message, "the server may now evict held locks: every hold ends");
            let mut token = self.token.write().unwrap_or_else(PoisonError::into_inner);
            token.cancel();
            *token = CancellationToken::new();
        }
        *refusal = Some(message);
    }

    fn restore(&self) {
        let mut refusal = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        if refusal.take().is_some() {
            tracing::warn!("the server no longer evicts: calls are served again");
        }
    }
}

impl RedisBackend {
    /// `lease`, granted by a call that began when `trust` was current,
    /// made to end with it; if a server was found evicting meanwhile, the
    /// grant may stand on a key it will evict: it is given back, and the
    /// call fails.
    pub(crate) async fn trusted(&self, lease: Lease, trust: &CancellationToken) -> Result<Lease> {
        let lease = lease.trusted_while(trust);
        if !trust.is_cancelled() {
            return Ok(lease);
        }
        if let Err(e) = self.release_lease(&lease).await {
            tracing::debug!(error = %e, "giving back a grant made while distrusted");
        }
        Err(Trust::lost(&lease))
    }

    /// Starts the task that reads the policy again every [`RECHECK`], for
    /// as long as the backend lives; none when the risk is accepted.
    pub(crate) fn watch_eviction(&self) {
        if self.inner.builder.accept_eviction {
            return;
        }
        // The task keeps no backend alive while it waits.
        let backend = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RECHECK);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = backend.upgrade() else {
                    return;
                };
                let backend = RedisBackend { inner };
                let mut conn = backend.connection();
                match check(&mut conn, backend.inner.request_timeout).await {
                    Ok(()) => backend.inner.trust.restore(),
                    Err(Error::UnsafeServer { message, .. }) => {
                        backend.inner.trust.distrust(message);
                    }
                    // Transport trouble is no verdict on the policy.
                    Err(e) => tracing::debug!(error = %e, "cannot read maxmemory-policy now"),
                }
            }
        });
    }
}

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
