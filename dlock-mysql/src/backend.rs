//! The backend handle, what its clones share, and its `Driver`
//! implementation ([`dlock_sql::driver!`]), which hands each call to the
//! module of its concern.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::wait::Wakeups;

use crate::pool::Pool;
use crate::sql::Statements;
use crate::wake::Sleepers;

/// The driver's name in errors and [`Backend::driver`](dlock_core::Backend::driver).
pub(crate) const NAME: &str = "mysql";

/// A MySQL / MariaDB lock backend over the version-row table. Cheap to
/// clone; clones share the pool.
///
/// No transaction or row lock outlives a single statement: the lease is the
/// row's `expires_at`, judged by the database clock. (The pessimistic
/// `SELECT … FOR UPDATE` design instead ties up a connection and a
/// transaction for the whole critical section, and a stalled holder blocks
/// everyone until the server's lock wait timeout.)
///
/// Every statement is bounded by the request timeout. A statement that
/// times out has an unknown outcome: its connection is closed rather than
/// returned to the pool, and an acquire is undone by its owner token in
/// the background, so the name is not blocked for a whole TTL.
#[derive(Clone)]
pub struct MySqlBackend {
    pub(crate) inner: Arc<Inner>,
}

/// What the clones of one backend share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Statements,
    /// Waiters in this process, woken by its own releases.
    pub(crate) wakeups: Wakeups,
    /// The connections registered waiters sleep on in the server.
    pub(crate) sleepers: Arc<Sleepers>,
    pub(crate) wake_ups: bool,
    pub(crate) max_poll: Duration,
    pub(crate) request_timeout: Duration,
}

impl MySqlBackend {
    /// The named lock this backend's registered waiters wait for, so that a
    /// test can take its connection away.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn wake_anchor_for_tests(&self) -> &str {
        self.inner.sleepers.anchor_name()
    }

    /// Whether the shared kinds' busiest calls go to the table's stored
    /// procedures (see `sql/call.rs`) rather than as text.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn calls_procedures(&self) -> bool {
        self.inner
            .sql
            .call
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl MySqlBackend {
    /// Whether waiters are woken by a notification on release: not
    /// declared, since wake-ups across processes are off unless the
    /// builder turns them on.
    pub(crate) fn notifies(&self) -> bool {
        false
    }
}

dlock_sql::driver!(MySqlBackend, NAME);
