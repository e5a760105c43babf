//! The backend handle and its [`Backend`] implementation, which checks each
//! request and hands it to the module of its concern.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::{Deadline, Wakeups};
use dlock_core::{Capabilities, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Result};

use crate::pool::Pool;
use crate::sql::Statements;
use crate::wake::Sleepers;

/// The driver's name in errors and [`Backend::driver`].
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

// By hand: the connect options inside hold the password.
impl std::fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBackend")
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
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
}

#[async_trait]
impl Driver for MySqlBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        // Tokens fold in the database clock (tested across a restart and
        // a deleted row); durable only with the settings in the README.
        caps.fencing_survives_restart = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
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
