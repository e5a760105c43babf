use std::time::Duration;

use crate::Mode;

/// A boxed error from a driver's client library, kept as the `source`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of every dlock operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock, by meaning rather than by backend.
///
/// Driver errors are kept as the [`source`](std::error::Error::source) of
/// [`Error::Connection`] and [`Error::Backend`], so the client library's own
/// message is never lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is not 1 to 255 bytes of UTF-8 without NUL.
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// What is wrong with the name, in words a caller can act on.
        reason: String,
    },

    /// An option or a piece of configuration (TTL, wait bound, URL, table
    /// name, ...) is out of range or malformed.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption {
        /// The option's name as the user spells it.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The lease is no longer the current holder of its lock: it was
    /// released, it expired, or another client took the lock over.
    #[error("lock `{name}` is not held by this lease")]
    NotHeld {
        /// The lock name.
        name: String,
    },

    /// The wait bound passed before the lock could be acquired.
    #[error("timed out after {waited:?} waiting for lock `{name}`")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The backend could not be reached, or the connection broke mid-request.
    /// Whether a request that was cut off took effect is unknown; drivers
    /// make sure such a lock expires with its TTL or session.
    #[error("{backend}: connection failed: {message}")]
    Connection {
        /// The driver's name (`redis`, `mysql`, `zookeeper`, ...).
        backend: &'static str,
        /// What the driver was doing.
        message: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },

    /// The server is reachable but cannot serve for now: it is loading its
    /// data, busy with a long script, a read-only replica, or in the middle
    /// of a failover. Trying again later may succeed.
    #[error("{backend}: temporarily unavailable: {message}")]
    Unavailable {
        /// The driver's name.
        backend: &'static str,
        /// What the server said.
        message: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend answered with an error (bad credentials, missing table,
    /// script error, ...).
    #[error("{backend}: {message}")]
    Backend {
        /// The driver's name.
        backend: &'static str,
        /// What went wrong, in the driver's words.
        message: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },

    /// The server is configured in a way that breaks the lock's guarantees
    /// (a Redis server that may evict keys under memory pressure, held
    /// locks among them). The driver refuses such a server unless told to
    /// accept the risk; asking again does not help.
    #[error("{backend}: unsafe server configuration: {message}")]
    UnsafeServer {
        /// The driver's name.
        backend: &'static str,
        /// What is unsafe, and how to make it safe.
        message: String,
    },

    /// The name is held or waited for as another kind of lock than the one
    /// asked for: a mutex and a reader-writer lock, or semaphores of
    /// different sizes. Refused rather than granted, since callers that
    /// disagree on what a name is would admit more holders than either
    /// expects.
    #[error("lock `{name}` is in use as a {held}, not a {asked}")]
    ModeConflict {
        /// The lock name.
        name: String,
        /// A mode the name is held or waited for in.
        held: Mode,
        /// The mode asked for.
        asked: Mode,
    },

    /// A write lock asked for by a task that holds the same name's read
    /// lock (through the same [`Locker`](crate::Locker)): waiting would
    /// wait for itself forever, so it fails at once. Release the read lock
    /// first.
    #[error("lock `{name}`: this task holds it for reading and cannot wait to write it")]
    Upgrade {
        /// The lock name.
        name: String,
    },

    /// A lock asked for by a task that holds the same name as a mutex or a
    /// write lock (through the same [`Locker`](crate::Locker)): waiting
    /// would wait for itself, so it fails at once. dlock's locks are not
    /// reentrant: pass the guard down instead of locking again. Futures
    /// joined in one task (`join!`, `select!`) count as that task: spawn
    /// one to have them wait for each other. A hold counts for the task
    /// that acquired it, even once its guard has moved to another task: to
    /// wait for a guard given away, acquire from another task, or through
    /// another `Locker` (`Locker::from_arc(locker.backend().clone())`).
    #[error("lock `{name}`: this task holds it already and would wait for itself")]
    Reentrant {
        /// The lock name.
        name: String,
    },

    /// A fenced write was refused: the resource has seen a greater fencing
    /// token than the writer's, so a later holder of the lock wrote to it
    /// and the writer's lease has ended. Nothing was written; the writer
    /// must not retry with the same token (see [`Fence`](crate::Fence)).
    #[error("resource `{resource}`: fencing token {token} is stale, {highest} was seen")]
    Fenced {
        /// The resource written to.
        resource: String,
        /// The writer's token.
        token: u64,
        /// The greatest token the resource has seen.
        highest: u64,
    },

    /// The backend does not support this operation.
    #[error("{operation} is not supported by the {backend} backend")]
    Unsupported {
        /// The driver's name.
        backend: &'static str,
        /// The operation asked for.
        operation: &'static str,
    },
}

impl Error {
    /// An [`Error::Connection`] wrapping a client library error.
    pub fn connection(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Connection {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::Backend`] wrapping a client library error.
    pub fn backend(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::Unavailable`] wrapping a client library error.
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::Connection`] for a request that got no answer in time:
    /// retryable, like any lost connection, and its outcome is unknown.
    pub fn timed_out(backend: &'static str, message: impl Into<String>) -> Self {
        Error::connection(
            backend,
            message,
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    }

    /// An [`Error::Backend`] for a reply the driver cannot read (a wrong
    /// type, a malformed token): the server or something between spoke
    /// another protocol than the driver expects.
    pub fn malformed(backend: &'static str, what: &str, reply: impl std::fmt::Debug) -> Self {
        Error::Backend {
            backend,
            message: format!("unexpected reply to {what}: {reply:?}"),
            source: None,
        }
    }

    /// An [`Error::NotHeld`] for the lock `name`.
    pub fn not_held(name: &str) -> Self {
        Error::NotHeld {
            name: name.to_owned(),
        }
    }

    /// An [`Error::InvalidOption`].
    pub fn invalid_option(option: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            option,
            reason: reason.into(),
        }
    }

    /// Which variant this is, without its details: for matching on the
    /// kind of failure, and (with [`ErrorKind::as_str`]) for metrics labels
    /// and logs.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. } => ErrorKind::InvalidName,
            Error::InvalidOption { .. } => ErrorKind::InvalidOption,
            Error::NotHeld { .. } => ErrorKind::NotHeld,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Connection { .. } => ErrorKind::Connection,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::UnsafeServer { .. } => ErrorKind::UnsafeServer,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::ModeConflict { .. } => ErrorKind::ModeConflict,
            Error::Upgrade { .. } => ErrorKind::Upgrade,
            Error::Reentrant { .. } => ErrorKind::Reentrant,
            Error::Fenced { .. } => ErrorKind::Fenced,
        }
    }

    /// Whether trying the same call again may succeed: the lock was busy,
    /// the connection failed, or the server was briefly unavailable.
    /// Invalid input, "not held" and unsupported operations fail the same
    /// way every time.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::Connection { .. } | Error::Unavailable { .. }
        )
    }
}

/// The kind of an [`Error`], one per variant ([`Error::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidName`].
    InvalidName,
    /// [`Error::InvalidOption`].
    InvalidOption,
    /// [`Error::NotHeld`].
    NotHeld,
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::Connection`].
    Connection,
    /// [`Error::Unavailable`].
    Unavailable,
    /// [`Error::Backend`].
    Backend,
    /// [`Error::UnsafeServer`].
    UnsafeServer,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::ModeConflict`].
    ModeConflict,
    /// [`Error::Upgrade`].
    Upgrade,
    /// [`Error::Reentrant`].
    Reentrant,
    /// [`Error::Fenced`].
    Fenced,
}

impl ErrorKind {
    /// The kind in snake case (`not_held`, `timeout`, …): a stable
    /// metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidName => "invalid_name",
            ErrorKind::InvalidOption => "invalid_option",
            ErrorKind::NotHeld => "not_held",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Backend => "backend",
            ErrorKind::UnsafeServer => "unsafe_server",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ModeConflict => "mode_conflict",
            ErrorKind::Upgrade => "upgrade",
            ErrorKind::Reentrant => "reentrant",
            ErrorKind::Fenced => "fenced",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
