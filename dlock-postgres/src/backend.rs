//! The backend handle and its [`Backend`] implementation, which checks each
//! request and hands it to the module of its concern.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::{Deadline, Wakeups};
use dlock_core::{Capabilities, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Result};

use crate::notify::Listener;
use crate::pool::Pool;
use crate::sql::Statements;

/// The driver's name in errors and [`Backend::driver`].
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

// By hand: the connect options inside hold the password.
impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
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
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl PgBackend {
    /// Times this backend's listener started listening (a reconnect
    /// counts), and the notifications it heard.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn listener_counts_for_tests(&self) -> (u64, u64) {
        self.inner.listener.counts()
    }
}

#[async_trait]
impl Driver for PgBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        // Tokens fold in the database clock (tested across a restart and
        // a deleted row).
        caps.fencing_survives_restart = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
        caps.notify = self.inner.listen.is_some();
        caps.rwlock = true;
        caps.semaphore = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        Ok(self.attempt(name, opts).await?.into_lease())
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        self.wait_for(name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_lease(lease).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        self.release_lease_after(lease, hold).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.extend_lease(lease).await
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        self.extend_leases(leases).await
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        self.downgrade_lease(write, opts).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        self.force_release_any(name).await
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        let mut holders = self.holders_of(name).await?;
        holders.truncate(limit);
        Ok(holders)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.list_locks(prefix, cursor, limit).await
    }
}
