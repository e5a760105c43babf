//! What the redis client's errors and the scripts' refusals mean as
//! [`dlock_core::Error`]s.

use dlock_core::{Error, Lease, Result};
use redis::RedisError;

use crate::backend::{NAME, RedisBackend};

/// A URL (or TLS setting) the client library refuses.
pub(crate) fn bad_url(e: &RedisError) -> Error {
    Error::invalid_option("url", e.to_string())
}

/// Maps a client error: transport trouble is a connection error (the
/// request may or may not have run), anything the server said is a backend
/// error.
pub(crate) fn redis_error(e: RedisError, doing: &str) -> Error {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Error::backend(NAME, format!("{doing}: authentication failed"), e);
    }
    // The server is there but cannot serve this moment: loading its data,
    // running a long script, a replica, mid-failover, or (a redirect the
    // cluster client gave up following while a slot moved and the
    // primaries learned its new owner one by one) mid-resharding. A
    // pipeline's error carries its first failed command's code.
    let code = e.code().map(str::to_owned).or_else(|| {
        let errors = e.clone().into_server_errors()?;
        errors.first().map(|(_, error)| error.code().to_owned())
    });
    if matches!(
        code.as_deref(),
        Some(
            "LOADING"
                | "BUSY"
                | "READONLY"
                | "MASTERDOWN"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "MOVED"
                | "ASK"
        )
    ) {
        return Error::unavailable(NAME, doing, e);
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        Error::connection(NAME, doing, e)
    } else {
        Error::backend(NAME, doing, e)
    }
}

/// A grant or extension that too few replicas acknowledged in time.
pub(crate) fn unconfirmed(doing: &str) -> Error {
    Error::unavailable(
        NAME,
        doing,
        std::io::Error::other("too few replicas acknowledged it in time (durable grants)"),
    )
}

/// What an owner-checked script's reply means for `lease`: `1` when the
/// caller held the lock and the script acted, `0` when it did not hold it.
/// An action the replicas did not confirm (durable grants) is an error
/// even though the primary took it: a promoted replica may not have it.
pub(crate) fn owner_checked(lease: &Lease, reply: i64, confirmed: bool, doing: &str) -> Result<()> {
    if reply != 1 {
        return Err(Error::not_held(lease.name()));
    }
    if !confirmed {
        return Err(unconfirmed(doing));
    }
    Ok(())
}

impl RedisBackend {
    /// Maps a failed request's error, and with Sentinel, asks for a look
    /// at the primary now when the failure may mean the old one is gone.
    pub(crate) fn fail(&self, e: RedisError, doing: &str) -> Error {
        let error = redis_error(e, doing);
        if matches!(error, Error::Connection { .. } | Error::Unavailable { .. })
            && let Some(sentinel) = &self.inner.sentinel
        {
            sentinel.nudge();
        }
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_server_states_are_retryable() {
        for code in [
            "LOADING",
            "BUSY",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "MOVED",
            "ASK",
        ] {
            let e = redis::make_extension_error(code.to_owned(), Some("try later".to_owned()));
            let mapped = redis_error(e, "acquire");
            assert!(
                matches!(mapped, Error::Unavailable { .. }) && mapped.is_retryable(),
                "{code}: {mapped:?}"
            );
        }
        let e = redis::make_extension_error("ERR".to_owned(), Some("bad".to_owned()));
        assert!(!redis_error(e, "acquire").is_retryable());
    }

    #[test]
    fn owner_checked_replies() {
        let opts = dlock_core::LockOptions::new();
        let owner = dlock_core::OwnerToken::from_u128(7);
        let lease = Lease::with_ttl("a", owner, 1, &opts, tokio::time::Instant::now());
        assert!(owner_checked(&lease, 1, true, "extend").is_ok());
        // Not the holder: nothing was done, so there is nothing to confirm.
        for confirmed in [true, false] {
            let e = owner_checked(&lease, 0, confirmed, "extend").unwrap_err();
            assert!(matches!(e, Error::NotHeld { .. }), "{e:?}");
        }
        let e = owner_checked(&lease, 1, false, "extend").unwrap_err();
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
            "{e:?}"
        );
    }
}
