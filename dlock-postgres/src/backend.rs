//! The backend handle, what its clones share, and its `Driver`
//! implementation ([`dlock_sql::driver!`]), which hands each call to the
//! module of its concern.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::wait::Wakeups;

use crate::notify::Listener;
use crate::pool::Pool;
use crate::sql::Statements;

/// The driver's name in errors and [`Backend::driver`](dlock_core::Backend::driver).
pub(crate) const NAME: &str = "postgres";

/// A PostgreSQL lock backend over a lease table. Cheap to clone; clones
/// share the pool.
///
/// No transaction or row lock outlives a single statement: the lease is
/// the row's `expires_at`, judged by the database clock
/// (`clock_timestamp()`). Advisory locks are not used: they have no TTL,
/// vanish unseen with their connection, and break behind PgBouncer.
///
/// Every call is bounded by the request timeout, the wait for a pooled
/// connection included, and every statement by the same `statement_timeout`
/// on the server. A statement that times out has an unknown outcome: its
/// connection is closed rather than returned to the pool, and an acquire
/// is undone by its owner token in the background.
#[derive(Clone)]
pub struct PgBackend {
    pub(crate) inner: Arc<Inner>,
}

/// What the clones of one backend share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Statements,
    /// Mutex waiters in this process without wake-ups, by name.
    pub(crate) wakeups: Wakeups,
    /// Queued waiters in this process, by waiter token: a release names
    /// the ones it may have let in.
    pub(crate) queued_wakeups: Wakeups,
    /// With wake-ups on: where the listener connects.
    pub(crate) listen: Option<sqlx::postgres::PgConnectOptions>,
    pub(crate) listener: Listener,
    pub(crate) max_poll: Duration,
    /// Where the purges go on.
    pub(crate) purge: crate::purge::Cursor,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl PgBackend {
    /// Makes this backend's purges read `pages` at a time, so that a
    /// test's table is several slices.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn set_purge_slice_for_tests(&self, pages: u64) {
        self.inner
            .purge
            .slice
            .store(pages.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// Times this backend's listener started listening (a reconnect
    /// counts), and the notifications it heard.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn listener_counts_for_tests(&self) -> (u64, u64) {
        self.inner.listener.counts()
    }
}

impl PgBackend {
    /// Wake-ups across processes: with a listener, waiters hear releases
    /// by `NOTIFY`.
    pub(crate) fn notifies(&self) -> bool {
        self.inner.listen.is_some()
    }
}

dlock_sql::driver!(PgBackend, NAME);
