//! ZooKeeper's errors as dlock's.

use dlock_core::{Error, Lease};
use zookeeper_client as zk;

use crate::backend::NAME;

/// The client library's error as dlock's: a lost or expired session is a
/// connection error (retryable), a refused identity says so.
pub(crate) fn zk_error(e: zk::Error, doing: &str) -> Error {
    match e {
        zk::Error::AuthFailed | zk::Error::NoAuth => {
            Error::backend(NAME, format!("{doing}: authentication failed"), e)
        }
        zk::Error::ConnectionLoss
        | zk::Error::SessionExpired
        | zk::Error::ClientClosed
        | zk::Error::Timeout => Error::connection(NAME, doing, e),
        e => Error::backend(NAME, doing, e),
    }
}

/// The lease's node is gone, or was never ours.
pub(crate) fn not_held(lease: &Lease) -> Error {
    Error::not_held(lease.name())
}

/// Our queue node is gone while we wait or are granted: the session
/// expired under us.
pub(crate) fn node_vanished() -> Error {
    Error::connection(
        NAME,
        "our lock node disappeared (session expired)",
        zk::Error::SessionExpired,
    )
}

/// A retry loop that ran out of tries with no client error to show.
pub(crate) fn gave_up(message: String) -> Error {
    Error::Backend {
        backend: NAME,
        message,
        source: None,
    }
}
