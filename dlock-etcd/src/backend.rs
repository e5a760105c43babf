//! The backend handle and its [`Backend`] implementation, which checks each
//! request and hands it to the module of its concern.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::Deadline;
use dlock_core::{Capabilities, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Result};

use crate::client::Client;

/// The driver's name in errors and [`Backend::driver`].
pub(crate) const NAME: &str = "etcd";

/// An etcd lock backend. Cheap to clone; clones share the connection.
///
/// Each hold, and each waiter, is one key under the backend's session
/// lease of its TTL (see the crate docs): the cluster deletes the key when
/// the session ends, grants in the order of create revisions, and a hold's
/// fencing token is the revision at which its grant was confirmed. A
/// mutex's keys are those of etcd's own `concurrency.Mutex`, so `etcdctl
/// lock` and Go services share locks with it.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

// By hand: the client holds the credentials.
impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("prefix", &self.inner.prefix)
            .field("request_timeout", &self.inner.client.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What the clones of one backend share.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) sessions: crate::session::Sessions,
    pub(crate) watches: crate::watches::Watches,
    #[cfg(feature = "_test-hooks")]
    pub(crate) pause_after_join: Option<Duration>,
}

impl EtcdBackend {
    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn sessions(&self) -> &crate::session::Sessions {
        &self.inner.sessions
    }

    /// How many keys `name` has in etcd: its holds and its waiters.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub async fn keys_for_tests(&self, name: &str) -> Result<usize> {
        Ok(self.read_queue(name).await?.0.len())
    }

    /// `op` within one request timeout counted from now, however many
    /// requests it makes.
    pub(crate) async fn bounded<T>(
        &self,
        doing: &str,
        op: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(self.request_timeout(), op)
            .await
            .map_err(|_| crate::error::timed_out(doing))?
    }
}

#[async_trait]
impl Driver for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        // Revisions are the cluster's, kept on disk with its data.
        caps.fencing_survives_restart = true;
        caps.notify = true;
        caps.fifo = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
        caps.rwlock = true;
        caps.semaphore = true;
        caps.ttl_resolution = Duration::from_secs(1);
        caps.ttl_restarts_on_leader_change = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    fn request_timeout(&self) -> Duration {
        self.inner.client.request_timeout
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.attempt(name, opts).await
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
        self.holders_of(name, limit).await
    }

    async fn watch(&self, name: &str) -> Result<Option<Box<dyn dlock_core::NameWatch>>> {
        self.watch_name(name).await.map(Some)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.list_locks(prefix, cursor, limit).await
    }
}
