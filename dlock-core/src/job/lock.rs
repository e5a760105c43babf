use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::JobOptions;
use crate::settings::deadline_after;
use crate::{Error, Guard, Locker, Result};

/// A run's lock, from the grant to the (possibly delayed) release.
pub(super) struct JobLock {
    pub(super) guard: Guard,
    started: Instant,
    /// When `at_most` ends the run: the lease's validity, or on session
    /// backends the start plus `at_most`.
    deadline: Instant,
    pub(super) at_least: Duration,
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
            delayed_release: locker.backend().capabilities().delayed_release,
        }))
    }

    /// Runs `job` while the lock holds, cancelled when the lease is lost
    /// or `at_most` passes (as [`Guard::while_held`]).
    pub(super) async fn guarded<F: Future>(&self, job: F) -> Result<F::Output> {
        tokio::select! {
            done = self.guard.while_held(job) => done,
            () = sleep_until(self.deadline) => {
                tracing::warn!(lock = self.guard.name(), "at_most passed: run cancelled");
                Err(Error::not_held(self.guard.name()))
            }
        }
    }

    /// Releases the lock, keeping it until `keep` after the start; a
    /// failure is logged (the job ran; the lock ends with its TTL or
    /// session) and returned.
    pub(super) async fn finish(self, keep: Duration) -> Result<()> {
        let name = self.guard.name().to_owned();
        let hold = keep.saturating_sub(self.started.elapsed());
        let done = if hold.is_zero() || !self.guard.is_valid() {
            self.guard.release().await
        } else if self.delayed_release {
            self.guard.release_after(hold).await
        } else {
            // The backend cannot keep the hold itself: this node keeps the
            // lock instead, as long as its lease lasts.
            let until = deadline_after(Instant::now(), hold);
            if until >= self.deadline {
                // Kept to its end: the lease ends by itself, as asked.
                sleep_until(self.deadline).await;
                return Ok(());
            }
            sleep_until(until).await;
            self.guard.release().await
        };
        match &done {
            Ok(()) | Err(Error::NotHeld { .. }) => {}
            Err(e) => tracing::warn!(lock = name, error = %e, "could not release a job's lock"),
        }
        done
    }
}
