use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::JobOptions;
use crate::options::deadline_after;
use crate::{Error, Guard, Locker, Result};

/// A run's lock, from the grant to the (possibly delayed) release.
pub(super) struct JobLock {
    pub(super) guard: Guard,
    started: Instant,
    /// When `at_most` ends the run: the lease's validity, or on session
    /// backends the start plus `at_most`.
    deadline: Instant,
    at_least: Duration,
    cancel_on_lost: bool,
    delayed_release: bool,
}

impl JobLock {
    pub(super) async fn take(
        locker: &Locker,
        name: &str,
        opts: &JobOptions,
    ) -> Result<Option<JobLock>> {
        opts.validate()?;
        let started = Instant::now();
        let Some(guard) = locker.try_acquire(name, &opts.lock_options()).await? else {
            return Ok(None);
        };
        let deadline = guard
            .valid_until()
            .unwrap_or_else(|| deadline_after(started, opts.at_most));
        Ok(Some(JobLock {
            guard,
            started,
            deadline,
            at_least: opts.at_least,
            cancel_on_lost: opts.cancel_on_lost,
            delayed_release: locker.backend().capabilities().delayed_release,
        }))
    }

    /// Runs `job` while the lock holds: `None` if it was cancelled because
    /// the lease was lost or `at_most` passed.
    pub(super) async fn guarded<F: Future>(&self, job: F) -> Option<F::Output> {
        if !self.guard.is_valid() {
            return None;
        }
        if !self.cancel_on_lost {
            return Some(job.await);
        }
        tokio::select! {
            value = job => Some(value),
            () = self.guard.lost() => {
                tracing::warn!(lock = self.guard.name(), "lease lost: run cancelled");
                None
            }
            () = sleep_until(self.deadline) => {
                tracing::warn!(lock = self.guard.name(), "at_most passed: run cancelled");
                None
            }
        }
    }

    /// Releases the lock, keeping it until `at_least` after the start.
    pub(super) async fn finish(self) {
        let keep = self.at_least;
        self.finish_keeping(keep).await;
    }

    /// Releases the lock, keeping it until `keep` after the start.
    pub(super) async fn finish_keeping(self, keep: Duration) {
        let name = self.guard.name().to_owned();
        let hold = keep.saturating_sub(self.started.elapsed());
        let done = if hold.is_zero() || !self.guard.is_valid() {
            self.guard.release().await
        } else if self.delayed_release {
            self.guard.release_after(hold).await
        } else {
            // The backend cannot keep the hold itself: this node keeps the
            // lock instead, as long as its lease lasts.
            let until = deadline_after(Instant::now(), hold).min(self.deadline);
            sleep_until(until).await;
            self.guard.release().await
        };
        match done {
            Ok(()) | Err(Error::NotHeld { .. }) => {}
            // The job ran; the lock ends with its TTL or session.
            Err(e) => tracing::warn!(lock = name, error = %e, "could not release a job's lock"),
        }
    }
}
