//! The one rule of every body run under a lock ([`Locker::with_lock`],
//! [`Semaphore::with_permit`](crate::Semaphore::with_permit),
//! [`Election::lead`](crate::Election::lead), [`Locker::run_job`](crate::Locker::run_job),
//! `#[locked]`): it starts only under a valid lease, it is cancelled
//! (dropped at its next `.await`) the moment the lease is lost, and when it
//! finishes its value comes back beside the release's outcome, never
//! replaced by it.

use std::future::Future;

use crate::{Error, Guard, Result};

/// A body's value, and how giving its lock back went.
///
/// The body finished while its lease was valid, so its work stands
/// whatever [`release`](Self::release) says: a failed release only means
/// the lock ends with its TTL or session instead of now.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use dlock_core::{Locker, LockOptions, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let done = locker.with_lock("invoice:42", &LockOptions::new(), async |guard| {
///     guard.fencing_token()
/// }).await?;
/// if let Err(e) = &done.release {
///     eprintln!("the lock ends with its TTL instead: {e}");
/// }
/// assert!(done.value > 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "holds the body's value, and the release's error if it failed"]
pub struct Finished<T> {
    /// What the body returned.
    pub value: T,
    /// The release's outcome (for [`Election::lead`](crate::Election::lead),
    /// the resignation's): `Err` when the lock could not be given back,
    /// [`Error::NotHeld`] when its lease ended right after the body.
    pub release: Result<()>,
}

impl<T> Finished<T> {
    /// The body's value, the release's outcome dropped (a failed release
    /// was logged by then).
    pub fn into_value(self) -> T {
        self.value
    }

    /// The body's value, or the release's error with the value dropped.
    ///
    /// # Errors
    /// The release's error.
    pub fn into_result(self) -> Result<T> {
        self.release.map(|()| self.value)
    }
}

impl Guard {
    /// Runs `work` while the lease holds: its value when it finished
    /// before the lease was lost, or [`Error::NotHeld`] when the lease was
    /// lost first (`work` is then dropped at once) or before it could
    /// start (`work` never runs). A value that came as the lease ended is
    /// still the value: whether the lock was held to the end is
    /// [`Guard::is_valid`]'s to say (and [`Finished::release`]'s, for the
    /// calls that release after the body).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// use dlock_core::{Locker, LockOptions, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let guard = locker.acquire("report", &LockOptions::new()).await?;
    /// let rows = guard.while_held(async { 42 }).await?;
    /// guard.release().await?;
    /// assert_eq!(rows, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotHeld`] as above.
    pub async fn while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        if !self.is_valid() {
            return Err(Error::not_held(self.name()));
        }
        tokio::select! {
            // Lost first when both are ready: the body may be cut short.
            biased;
            () = self.lost() => {
                tracing::warn!(lock = self.name(), "lease lost: body cancelled");
                Err(Error::not_held(self.name()))
            }
            value = work => Ok(value),
        }
    }

    /// Releases after a body that finished, logging a failure (the lock
    /// then ends with its TTL or session). A lease that ended as the body
    /// finished is [`Error::NotHeld`] beside the value: the body may have
    /// written after another holder began, so its writes must have been
    /// fenced.
    pub(crate) async fn finish<T>(self, value: T) -> Finished<T> {
        let name = self.name().to_owned();
        let release = match self.is_valid() {
            true => self.release().await,
            false => {
                // Dropped: released in the background, in case the server
                // still has it.
                drop(self);
                Err(Error::not_held(&name))
            }
        };
        if let Err(e) = &release {
            tracing::warn!(lock = name, error = %e, "could not release after the body ran");
        }
        Finished { value, release }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::time::{Instant, sleep};

    use super::*;
    use crate::{
        Backend, Capabilities, Election, JobOptions, Lease, LockInfo, LockOptions, Locker,
        MemoryBackend, OnLost,
    };

    /// Grants as memory does, but every release fails as on a lost link.
    #[derive(Debug)]
    struct NoRelease(MemoryBackend);

    #[async_trait]
    impl Backend for NoRelease {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
            self.0.try_acquire(name, opts).await
        }
        async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
            self.0.acquire(name, opts).await
        }
        async fn release(&self, _: &Lease) -> Result<()> {
            Err(Error::Connection {
                backend: "test",
                message: "release: the link is down".into(),
                source: None,
            })
        }
        async fn extend(&self, lease: &mut Lease) -> Result<()> {
            self.0.extend(lease).await
        }
        async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
            self.0.inspect(name).await
        }
    }

    #[tokio::test]
    async fn a_failed_release_comes_back_beside_the_value() {
        let locker = Locker::new(NoRelease(MemoryBackend::new()));
        let done = locker
            .with_lock("n", &LockOptions::new(), async |_| 42)
            .await
            .expect("the body ran under the lock");
        assert_eq!(done.value, 42);
        assert!(matches!(done.release, Err(Error::Connection { .. })));
        let election = Election::new(locker.clone(), "e", "a");
        let led = election.lead(OnLost::Fail, |_| async { 7 }).await.unwrap();
        assert_eq!(led.value, 7);
        assert!(matches!(led.release, Err(Error::Connection { .. })));
        let opts = JobOptions::new(Duration::from_secs(10));
        let ran = locker.run_job("j", &opts, async |_| 9).await.unwrap();
        let crate::JobOutcome::Ran(ran) = ran else {
            panic!("the job was skipped");
        };
        assert_eq!(ran.value, 9);
        assert!(matches!(ran.release, Err(Error::Connection { .. })));
    }

    /// Every body under a lock follows one rule: cancelled the moment its
    /// lease ends, the call answering `NotHeld`.
    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_cancels_every_kind_of_body_alike() {
        let locker = Locker::new(MemoryBackend::new());
        let ttl = Duration::from_secs(1);
        let opts = LockOptions::new().ttl(ttl).renew(false);
        let finished = AtomicU32::new(0);
        let body = async || {
            sleep(Duration::from_secs(60)).await;
            finished.fetch_add(1, Ordering::SeqCst);
        };
        let started = Instant::now();
        let with_lock = locker.with_lock("a", &opts, async |_| body().await).await;
        let election = Election::new(locker.clone(), "b", "me").options(opts.clone());
        let lead = election.lead(OnLost::Fail, |_| body()).await;
        let job = JobOptions::new(ttl);
        let run_job = locker.run_job("c", &job, async |_| body().await).await;
        for (call, r) in [
            ("with_lock", with_lock.map(|_| ())),
            ("lead", lead.map(|_| ())),
            ("run_job", run_job.map(|_| ())),
        ] {
            assert!(matches!(r, Err(Error::NotHeld { .. })), "{call}: {r:?}");
        }
        assert_eq!(finished.load(Ordering::SeqCst), 0, "a body ran on");
        // Each was cut at its lease's end, not at the body's.
        assert!(started.elapsed() < ttl * 4, "{:?}", started.elapsed());
    }
}
