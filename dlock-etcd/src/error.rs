//! gRPC statuses as dlock errors.

use dlock_core::Error;
use tonic::{Code, Status};

use crate::backend::NAME;

/// A failed call as a dlock error: a lost connection, a member without a
/// leader or a timeout is retryable, the rest is the server's refusal.
pub(crate) fn grpc_error(status: Status, doing: &str) -> Error {
    let message = format!("{doing}: {}", status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::ResourceExhausted => {
            // "no leader", "leader changed", a member stopping, "too many
            // requests": the cluster answers again once it has a leader or
            // has caught up.
            if status.message().contains("leader") || status.message().contains("stopped") {
                Error::unavailable(NAME, message, status)
            } else {
                Error::connection(NAME, message, status)
            }
        }
        // tonic reports a broken transport (a reset, a GOAWAY) as Unknown
        // or Internal with the cause inside.
        Code::Unknown | Code::Internal
            if status.message().contains("transport") || status.message().contains("h2") =>
        {
            Error::connection(NAME, message, status)
        }
        _ => Error::backend(NAME, message, status),
    }
}

/// A call that got no answer in time: its effect is unknown.
pub(crate) fn timed_out(doing: &str) -> Error {
    Error::timed_out(NAME, format!("{doing}: no answer in time"))
}

/// Whether the server said the lease does not exist (it expired or was
/// revoked).
pub(crate) fn is_lease_not_found(error: &Error) -> bool {
    match error {
        Error::Backend { message, .. } => message.contains("requested lease not found"),
        _ => false,
    }
}

/// Whether the server refused a grant because the lease id is taken: the
/// lease exists (granted by the request the undo races).
pub(crate) fn is_lease_taken(error: &Error) -> bool {
    match error {
        Error::Backend { message, .. } => message.contains("lease already exists"),
        _ => false,
    }
}
