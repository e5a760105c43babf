use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::renew::{Registration, Renewal, Renewer};
use crate::settings::deadline_after;
use crate::shared::{HoldMark, Holds};
use crate::{
    Backend, Error, Finished, Lease, LockInfo, LockOptions, LockPage, Observed, OwnerToken, Result,
};

/// The handle users lock with: a shared backend plus guards, renewal and
/// [`with_lock`](Locker::with_lock). Cheap to clone.
///
/// A locker and its clones share one renewal task for all their guards: it
/// renews the leases that fall due together in batches
/// ([`Backend::extend_many`]: one request per 1,000 leases on Redis and
/// MySQL), and tells each guard `lost()` at its own deadline. Keep one
/// locker per backend and clone it, rather than making a locker per lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use dlock_core::{Locker, LockOptions, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let guard = locker.acquire("report:daily", &LockOptions::new()).await?;
/// assert!(guard.is_valid());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Locker {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) renewer: Renewer,
    pub(crate) holds: Holds,
}

impl Locker {
    /// A locker over a backend. Every call it makes is traced (and, with
    /// the `metrics` feature, counted): see [`Observed`].
    pub fn new(backend: impl Backend + 'static) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a backend that is already shared.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        let backend: Arc<dyn Backend> = Arc::new(Observed::new(backend));
        Locker {
            renewer: Renewer::new(backend.clone()),
            backend,
            holds: Holds::default(),
        }
    }

    /// The backend (observed), for direct use of the lease-level API.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Waits for `name` up to the options' wait bound and returns a guard
    /// that holds it, in the options' [`Mode`](crate::Mode).
    ///
    /// # Errors
    /// Those of [`Backend::acquire`]; [`Error::Unsupported`] for a mode the
    /// backend lacks; [`Error::Upgrade`] for a write lock of a name this
    /// task holds for reading, [`Error::Reentrant`] for a name this task
    /// holds as a mutex or a write lock (through this locker or a clone):
    /// both would wait for themselves.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Guard> {
        self.check_mode(name, opts, true)?;
        let lease = self.backend.acquire(name, opts).await?;
        Ok(self.guard(lease, opts))
    }

    /// One attempt: a guard if `name` was free, `None` if it is held.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    #[must_use = "a guard releases its lock when dropped"]
    pub async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Guard>> {
        self.check_mode(name, opts, false)?;
        let lease = self.backend.try_acquire(name, opts).await?;
        Ok(lease.map(|l| self.guard(l, opts)))
    }

    pub(crate) fn guard(&self, lease: Lease, opts: &LockOptions) -> Guard {
        let renew = Renewal {
            on: opts.get_renew(),
            until: opts
                .get_max_hold()
                .map(|max| deadline_after(Instant::now(), max)),
        };
        let mut guard = Guard::watched(&self.renewer, self.backend.clone(), lease, renew);
        guard.hold_mark = self.holds.mark(&guard.lease);
        guard
    }

    /// Runs `f` while holding `name`, then releases it: the "lock this method
    /// body by a key" pattern. The guard is renewed while `f` runs; `f`
    /// starts only under a valid lease and is cancelled (dropped at its
    /// next `.await`) the moment the lease is lost (see [`Finished`] for
    /// the rule every body under a lock follows).
    ///
    /// # Errors
    /// Those of [`Locker::acquire`]; [`Error::NotHeld`] when the lease was
    /// lost before `f` finished: `f` may have been cut short, and another
    /// client may have run the same work meanwhile, so writes should be
    /// fenced with [`Guard::fencing_token`]. A failed release is not an
    /// error here: it comes back beside the value ([`Finished::release`]).
    pub async fn with_lock<T>(
        &self,
        name: &str,
        opts: &LockOptions,
        f: impl AsyncFnOnce(&Guard) -> T,
    ) -> Result<Finished<T>> {
        let guard = self.acquire(name, opts).await?;
        let value = guard.while_held(f(&guard)).await?;
        Ok(guard.finish(value).await)
    }

    /// Who holds `name` now, if anyone.
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.backend.inspect(name).await
    }

    /// Every live hold of `name` (each reader, each permit); see
    /// [`Backend::holders`].
    pub async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        self.backend.holders(name).await
    }

    /// A page of the held locks whose names start with `prefix`; see
    /// [`Backend::list`].
    pub async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.backend.list(prefix, cursor, limit).await
    }
}

/// A held lock. It renews its lease in the background, between a sixth and
/// a third of the TTL after the last renewal, tells when the lease can no
/// longer be trusted ([`Guard::lost`]),
/// and releases the lock when dropped (in the background; the TTL or
/// session is the final backstop). Prefer the explicit, awaited
/// [`Guard::release`], which reports whether the lock was still held.
///
/// Bind it for as long as the lock must be held: a guard dropped at once
/// (`locker.acquire(…).await?;` as a statement) releases at once, and the
/// compiler warns about it.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # async fn f(locker: dlock_core::Locker) -> dlock_core::Result<()> {
/// locker.acquire("report", &dlock_core::LockOptions::new()).await?;
/// # Ok(()) }
/// ```
///
/// ```
/// #![deny(unused_must_use)]
/// # async fn f(locker: dlock_core::Locker) -> dlock_core::Result<()> {
/// let _guard = locker.acquire("report", &dlock_core::LockOptions::new()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a guard releases its lock when dropped: bind it for as long as the lock must be held"]
pub struct Guard {
    backend: Arc<dyn Backend>,
    lease: Lease,
    lost: CancellationToken,
    // Stops the renewal when the guard goes away, however it goes.
    _registration: Option<Registration>,
    released: bool,
    // Its place in its locker's count of holds per task.
    hold_mark: Option<HoldMark>,
}

impl Guard {
    /// Wraps a lease from `backend`, with renewal (when `renew` is set) and
    /// the lost signal at the validity deadline. Guards from a [`Locker`]
    /// share its renewal scheduler, which renews many leases per request;
    /// this one gets a scheduler of its own.
    pub fn new(backend: Arc<dyn Backend>, lease: Lease, renew: bool) -> Self {
        let renew = Renewal {
            on: renew,
            until: None,
        };
        Self::watched(&Renewer::new(backend.clone()), backend, lease, renew)
    }

    fn watched(renewer: &Renewer, backend: Arc<dyn Backend>, lease: Lease, renew: Renewal) -> Self {
        let lost = lease.lost_token().child_token();
        let registration = renewer.register(&lease, renew, lost.clone());
        Guard {
            backend,
            lease,
            lost,
            _registration: registration,
            released: false,
            hold_mark: None,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// The fencing token to pass to the protected resource.
    pub fn fencing_token(&self) -> u64 {
        self.lease.fencing_token()
    }

    /// The owner token of this grant.
    pub fn owner(&self) -> OwnerToken {
        self.lease.owner()
    }

    /// Until when the lease can be trusted, as of the last renewal; `None`
    /// for session leases.
    pub fn valid_until(&self) -> Option<Instant> {
        match &self._registration {
            Some(registration) => registration.valid_until(),
            None => self.lease.valid_until(),
        }
    }

    /// Whether the lease can still be trusted now.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && self.valid_until().is_none_or(|t| Instant::now() < t)
    }

    /// Resolves the moment the lease can no longer be trusted: renewal
    /// failed until the validity deadline, the lock was taken over, or the
    /// session was lost. Never resolves while the lease is good.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// The kind of hold: a mutex's, a reader's, a writer's or a permit.
    pub fn mode(&self) -> crate::Mode {
        self.lease.mode()
    }

    /// The lease as granted (its deadline is that of the grant; see
    /// [`Guard::valid_until`] for the renewed one).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Releases the lock now. A lease with a
    /// [`lock_delay`](LockOptions::lock_delay) that is no longer trusted
    /// is not released (nor when the guard is dropped): the server keeps
    /// the name from everyone until the delay is over.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the lease had already ended; connection errors
    /// leave the lock to expire with its TTL or session.
    pub async fn release(mut self) -> Result<()> {
        if self.keeps_its_delay() {
            self.released = true;
            return Err(Error::not_held(self.name()));
        }
        self.lost.cancel();
        let done = self.backend.release(&self.lease).await;
        // Only now: if this future is dropped midway, `Drop` releases in
        // the background instead.
        self.released = true;
        done
    }

    /// Releases the lock but keeps the name locked on the server for `hold`
    /// more (see [`Backend::release_after`]); renewal stops now.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the lease had already ended;
    /// [`Error::Unsupported`] where the backend cannot
    /// ([`Capabilities::delayed_release`](crate::Capabilities::delayed_release)),
    /// and the lock is released as when the guard is dropped. After any
    /// other error (or if this future is dropped) the hold may have been
    /// applied, so the lock is left to end with its TTL or session, never
    /// released early.
    pub async fn release_after(mut self, hold: Duration) -> Result<()> {
        if !self.backend.capabilities().delayed_release {
            return Err(Error::Unsupported {
                backend: self.backend.driver(),
                operation: "release_after",
            });
        }
        self.lost.cancel();
        self.released = true;
        self.backend.release_after(&self.lease, hold).await
    }

    /// A token cancelled when [`Guard::lost`] resolves (or the guard is
    /// released or dropped), for a task that cannot borrow the guard.
    /// Cancelling it does not affect the guard.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }
}

impl Guard {
    /// Whether the lease has a lock-delay and is no longer trusted: it is
    /// then left to the server, which grants the name to nobody until the
    /// delay is over. Released now, it would be free at once, while work
    /// cancelled when it was lost may still have writes in flight.
    fn keeps_its_delay(&self) -> bool {
        !self.lease.lock_delay().is_zero() && !self.is_valid()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released || self.keeps_its_delay() {
            return;
        }
        self.lost.cancel();
        crate::driver::undo::release_in_background(self.backend.clone(), self.lease.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::{Capabilities, MemoryBackend};

    /// Hands out leases whose validity ended before they were returned, as
    /// a driver that forgot to judge a late reply would.
    #[derive(Debug)]
    struct Late(MemoryBackend);

    #[async_trait]
    impl Backend for Late {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
            Ok(self.0.try_acquire(name, opts).await?.map(|lease| {
                let long_ago = Instant::now() - opts.get_ttl() * 2;
                Lease::with_ttl(name, lease.owner(), lease.fencing_token(), opts, long_ago)
            }))
        }
        async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
            match self.try_acquire(name, opts).await? {
                Some(lease) => Ok(lease),
                None => Err(Error::Timeout {
                    name: name.to_owned(),
                    waited: Duration::ZERO,
                }),
            }
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            self.0.release(lease).await
        }
        async fn extend(&self, lease: &mut Lease) -> Result<()> {
            self.0.extend(lease).await
        }
        async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
            self.0.inspect(name).await
        }
    }

    #[tokio::test]
    async fn with_lock_never_runs_its_body_under_an_expired_lease() {
        let locker = Locker::new(Late(MemoryBackend::new()));
        let ran = AtomicBool::new(false);
        let opts = LockOptions::new().ttl(Duration::from_secs(1));
        let r = locker
            .with_lock("late", &opts, async |_| ran.store(true, Ordering::SeqCst))
            .await;
        assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
        assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
    }
}
