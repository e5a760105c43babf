//! The backend type, what its clones share, and the [`Backend`] impl, which
//! hands each operation to the file of its concern.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::Deadline;
use dlock_core::{Capabilities, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Result};

use crate::builder::RedisBuilder;
use crate::conn::Connection;
use crate::eviction::Trust;
use crate::keys::{Keys, keys};
use crate::notify::{Notifications, Pushes};
use crate::scripts::{QueueScripts, SHARDED, SINGLE};
use crate::sentinel::Sentinel;

/// The driver's name in errors and metrics.
pub(crate) const NAME: &str = "redis";

/// A Redis lock backend. Cheap to clone; clones share connections.
///
/// Needs Redis 6.2 or later (RESP3 for the pub/sub connection, `SET … GET`
/// for the fencing counter), or Valkey. On one server the acquire and
/// release scripts are sent the lock key alone and derive the lock's other
/// keys from it, which Redis and Valkey allow; a server that refuses keys
/// a script did not declare (Dragonfly by default) refuses them. See the
/// crate docs for the key layout.
///
/// With a `redis+sentinel://` URL it asks the Sentinels for the primary,
/// hears their `+switch-master` announcements, asks them again every second
/// and whenever a request fails for want of a primary, and moves to the
/// primary they name: it follows a failover within about a second, even
/// when the old primary still answers it.
///
/// With a `redis+cluster://` URL it talks to a Redis Cluster (7 or later):
/// each lock's keys share one hash slot, scripts go to the slot's node,
/// `MOVED` and `ASK` redirections are followed, and wake-ups travel on
/// sharded channels (`SPUBLISH`), so a release message stays on the node
/// that holds the lock. [`Backend::list`](dlock_core::Backend::list) is not supported there.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

/// What the clones of one backend share.
pub(crate) struct Inner {
    /// Replaced when Sentinel names a new primary.
    pub conn: RwLock<Connection>,
    /// Redis Cluster: sharded wake-up channels, one per waiting lock.
    pub cluster: bool,
    pub sentinel: Option<Sentinel>,
    /// The settings, for connections to a new primary among others.
    pub builder: RedisBuilder,
    /// Where every notification connection of this backend hands its
    /// messages: kept to connect to a new primary.
    pub pushes: Arc<Pushes>,
    pub prefix: String,
    pub max_poll: Duration,
    pub request_timeout: Duration,
    pub notifications: Notifications,
    /// Identifies this client's waiters in the lock queues.
    pub client_id: String,
    /// `<prefix>:wake:`: with the client id, the channel a client's
    /// waiters are woken on.
    pub wake_prefix: String,
    /// Ended when a server is found set to evict keys.
    pub trust: Trust,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The command connection, for callers that want to look at the keys.
    pub fn connection(&self) -> Connection {
        self.inner
            .conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The primary's address, when Sentinel chose it.
    pub fn sentinel_primary(&self) -> Option<String> {
        let sentinel = self.inner.sentinel.as_ref()?;
        sentinel.primary().map(|addr| addr.to_string())
    }

    /// How many wake-up channels this client is subscribed to: its own one
    /// once it has waited for a lock, else none. For this crate's tests
    /// only (feature `_test-hooks`); not a public API.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn subscribed_channels(&self) -> usize {
        self.inner.notifications.channels()
    }

    /// The scripts that wake waiters, as this deployment needs them.
    pub(crate) fn queue_scripts(&self) -> &'static QueueScripts {
        if self.inner.cluster {
            &SHARDED
        } else {
            &SINGLE
        }
    }

    /// The keys of the lock `name`.
    pub(crate) fn keys(&self, name: &str) -> Keys {
        keys(&self.inner.prefix, name)
    }
}

#[async_trait]
impl Driver for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        caps.notify = true;
        caps.fifo = true;
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

    // A grant's trust is taken before its request: a server found evicting
    // while the grant was on its way may already have evicted it.
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let trust = self.inner.trust.token();
        let attempt = self.attempt(name, &self.keys(name), opts, "", None).await?;
        match attempt.into_lease() {
            Some(lease) => self.trusted(lease, &trust).await.map(Some),
            None => Ok(None),
        }
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        let trust = self.inner.trust.token();
        let lease = self.wait_for(name, opts, deadline).await?;
        self.trusted(lease, &trust).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_lease(lease).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        self.release_with_hold(lease, hold).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        if lease.lost_token().is_cancelled() {
            return Err(Trust::lost(lease));
        }
        self.extend_lease(lease).await
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut held = self.extend_leases(leases).await?;
        for (held, lease) in held.iter_mut().zip(leases.iter()) {
            *held &= !lease.lost_token().is_cancelled();
        }
        Ok(held)
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if write.lost_token().is_cancelled() {
            return Err(Trust::lost(write));
        }
        // The read hold inherits the write's trust: it keeps its key.
        let trust = write.lost_token().clone();
        let lease = self.downgrade_lease(write, opts).await?;
        self.trusted(lease, &trust).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        self.force_release_any(name).await
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        self.holders_of(name, limit).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.list_locks(prefix, cursor, limit).await
    }
}
