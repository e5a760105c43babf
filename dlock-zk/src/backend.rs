//! The backend handle, what all its parts share, and the `Backend` impl,
//! which hands each call to the module of its concern.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::Deadline;
use dlock_core::{Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Result};
use zookeeper_client as zk;

use crate::builder::ZkBuilder;
use crate::release::Uncertain;
use crate::session::Session;

pub(crate) const NAME: &str = "zookeeper";

/// A ZooKeeper lock backend: one session, shared by clones.
///
/// Leases live as long as the session: there is no TTL and extend only
/// checks that the lock node still exists.
///
/// # When a lease is lost
///
/// A lease's `lost` signal (and so `Guard::lost`) fires the moment the
/// client reports it is **disconnected**, not only when the session expires:
/// once disconnected, the client cannot know whether the server has expired
/// the session and handed the lock to the next waiter. If the connection
/// comes back within the session timeout the lock node still exists; the
/// driver keeps it until the lease is released or dropped (a release that
/// failed during the disconnect is retried on reconnect), but the lease
/// stays marked lost. Once disconnected so long that the server may have
/// expired the session (the grace period's bound, below), the driver gives
/// the lock nodes up: a server that takes the session back
/// after that (it was frozen, or the reconnect raced its expiry) has them
/// deleted at once, so a lost guard still alive holds nobody up.
///
/// With [`ZkBuilder::keep_leases_while_reconnecting`] a disconnect starts
/// a grace period instead: a reconnect to the same session within it keeps
/// the leases (the session's ephemeral nodes live as long as it does), and
/// only the end of the grace period, or the session's expiry, marks them
/// lost. The grace period ends before the server can have expired the
/// session, whatever made the connection fall silent.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZkBuilder,
    pub(crate) root: String,
    pub(crate) session: Mutex<Session>,
    /// Lock nodes whose delete failed for want of a connection.
    pub(crate) orphans: Mutex<Vec<String>>,
    /// Creates whose outcome is unknown (the reply never came): the node
    /// may exist, or appear once a queued request reaches the server, so
    /// it is looked for by its protected prefix until found or hopeless.
    pub(crate) uncertain: Mutex<Vec<Uncertain>>,
    /// Held by the clean-up after a reconnect: one at a time, so a delete
    /// an earlier one puts back (it failed) is taken by the next.
    pub(crate) cleaning: tokio::sync::Mutex<()>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Bounds a request by the request timeout: the client holds requests
    /// while it is disconnected, and one unanswered that long belongs to a
    /// session in doubt. Counts as a lost connection.
    ///
    /// So does a connection the client library dropped with the request in
    /// flight for a reason of its own (no answer within its connect
    /// timeout, a failed read or write: `Custom`; a reply it could not
    /// read: `UnexpectedError`, `UnmarshalError`): the library hands every
    /// pending request that error, not `ConnectionLoss`, yet the server may
    /// have applied it, so callers must look for what it made, as after any
    /// lost connection. (Only for requests: at connect, `Custom` is also a
    /// TLS or SASL configuration error, which no retry mends.)
    pub(crate) async fn bounded<T>(
        &self,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, zk::Error> {
        match tokio::time::timeout(Driver::request_timeout(self), request).await {
            Ok(Err(
                zk::Error::Custom(_)
                | zk::Error::UnexpectedError(_)
                | zk::Error::UnmarshalError { .. },
            ))
            | Err(_) => Err(zk::Error::ConnectionLoss),
            Ok(done) => done,
        }
    }

    /// The ACL of every node we create: with digest auth, only our
    /// identity may touch them.
    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }
}

#[async_trait]
impl Driver for ZkBackend {
    fn driver(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Session);
        caps.distributed = true;
        // The node's czxid, which grows across the ensemble and its
        // restarts.
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        // A watch on the node ahead wakes exactly the next waiter, in
        // sequence order.
        caps.notify = true;
        caps.fifo = true;
        // Protected creation finds a node whose create reply was lost.
        caps.cleanup = true;
        // A persistent hold node, which outlives the session.
        caps.delayed_release = true;
        // Readers and writers queue in one folder, in one sequence;
        // permits as Curator's InterProcessSemaphoreV2.
        caps.rwlock = true;
        caps.semaphore = true;
        caps
    }

    fn request_timeout(&self) -> Duration {
        let config = &self.inner.config;
        config.request_timeout.min(config.session_timeout)
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.contend(name, opts.get_mode(), opts.get_holder(), None)
            .await
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        self.wait_for(name, opts.get_mode(), opts.get_holder(), deadline)
            .await
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        self.downgrade_lease(write, opts).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.delete_lease(lease).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        self.release_holding(lease, hold).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.check_held(lease).await
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        // All at once on the session's connection.
        let checks = leases.iter_mut().map(|lease| async move {
            match self.check_held(lease).await {
                Ok(()) => Ok(true),
                Err(Error::NotHeld { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        });
        futures_util::future::join_all(checks)
            .await
            .into_iter()
            .collect()
    }

    async fn watch(&self, name: &str) -> Result<Option<Box<dyn dlock_core::NameWatch>>> {
        self.watch_name(name).await.map(Some)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.list_page(prefix, cursor, limit).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        self.force_delete(name).await
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        if limit == 1 {
            // The front of the queue alone: one read, not one per hold.
            let holder = self.holder(&self.client(), &self.lock_dir(name)).await?;
            return Ok(holder.into_iter().collect());
        }
        let mut holders = self.holders_of(name).await?;
        holders.truncate(limit);
        Ok(holders)
    }
}
