//! Scheduled jobs: a job that many nodes schedule runs once per occurrence.
//!
//! The model is ShedLock's, with one lock per occurrence rather than per
//! job. Each run takes its lock without waiting and is skipped when another
//! node holds it. Because occurrences have their own locks, a run that
//! takes longer than the period does not hold the next occurrence back:
//! another node runs it meanwhile (this node skips occurrences that came
//! due while it was busy). A job that must never overlap itself takes a
//! lock of its own inside the run (for example with [`Locker::acquire`]
//! on the job's name). [`JobOptions::at_most`] is the
//! lease: a node that dies mid-run frees the lock after it, and a run still
//! going then is cancelled. [`JobOptions::at_least`] keeps the lock held, by
//! the server's clock, until that long after the run started, even when the
//! run ends at once, so that a node whose timer fires a little later finds
//! the occurrence taken instead of running it again. A [`ScheduledJob`]
//! keeps each occurrence's lock longer, until `at_most` after the start
//! where the server can (its names are used once), and a node that gets to
//! an occurrence later than that skips it: an occurrence runs at most once,
//! and is missed only if every node is that late.
//!
//! [`Locker::run_job`] runs one occurrence; [`ScheduledJob`] runs a job on
//! a [`Schedule`] (a fixed period, or a cron expression with the `cron`
//! feature), one lock per occurrence: `<job>@<scheduled time in Unix ms>`.
//! Those names are used once: on Redis they expire, on ZooKeeper the
//! releasing node cleans up, and on MySQL each leaves a row, which the
//! driver's purger (`MySqlBackend::spawn_purger`) deletes after an hour.

use std::time::Duration;

use crate::driver::check_duration;
use crate::{Finished, Guard, LockOptions, Locker, MAX_TTL, MIN_TTL, Result};

mod lock;
mod schedule;
mod scheduled;
#[cfg(test)]
mod tests;

use lock::JobLock;
pub use schedule::Schedule;
pub use scheduled::{JobRun, RunReport, RunResult, ScheduledJob};

/// How a job's runs are locked.
///
/// ```
/// use std::time::Duration;
/// let opts = dlock_core::JobOptions::new(Duration::from_secs(600))
///     .at_least(Duration::from_secs(30));
/// assert!(opts.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOptions {
    at_most: Duration,
    at_least: Duration,
}

impl JobOptions {
    /// Runs hold their lock at most `at_most`: it is the lease's TTL, so a
    /// node that dies mid-run frees the lock after it, and a run still going
    /// then is cancelled (on every backend, session ones included). Choose
    /// it well above the job's longest run.
    pub fn new(at_most: Duration) -> Self {
        JobOptions {
            at_most,
            at_least: Duration::ZERO,
        }
    }

    /// Keeps the lock held until this long after the run started, even if
    /// the run ended sooner (default zero). Set it above the spread of the
    /// nodes' clocks and timers, below the schedule's period. The hold is
    /// kept by the server where the backend declares
    /// [`Capabilities::delayed_release`](crate::Capabilities::delayed_release),
    /// so it outlives the process; elsewhere the node keeps holding the
    /// lock itself.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// The longest a run holds its lock.
    pub fn get_at_most(&self) -> Duration {
        self.at_most
    }

    /// The shortest time a run's lock is held.
    pub fn get_at_least(&self) -> Duration {
        self.at_least
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOption`](crate::Error::InvalidOption) when `at_most` is not a valid TTL or
    /// `at_least` exceeds it.
    pub fn validate(&self) -> Result<()> {
        check_duration("at_most", self.at_most, MIN_TTL, MAX_TTL)?;
        check_duration("at_least", self.at_least, Duration::ZERO, self.at_most)?;
        self.lock_options().validate()
    }

    fn lock_options(&self) -> LockOptions {
        LockOptions::new()
            .ttl(self.at_most)
            .wait(Duration::ZERO)
            .renew(false)
    }
}

/// What became of one occurrence of a job on this node.
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "holds the job's value, and the release's error if it failed"]
pub enum JobOutcome<T> {
    /// This node ran it: the job's value, beside the release's outcome.
    Ran(Finished<T>),
    /// Another node holds (or held, within `at_least`) the occurrence's
    /// lock: skipped, not queued.
    Skipped,
}

impl Locker {
    /// Runs `job` once under the lock `name` unless another node holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// use std::time::Duration;
    /// use dlock_core::{JobOptions, JobOutcome, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let opts = JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(5));
    /// let first = locker.run_job("invoices@2026-11-22", &opts, async |_guard| 42).await?;
    /// assert!(matches!(first, JobOutcome::Ran(ran) if ran.value == 42));
    /// // Within `at_least`, the occurrence counts as taken.
    /// let again = locker.run_job("invoices@2026-11-22", &opts, async |_guard| 43).await?;
    /// assert!(matches!(again, JobOutcome::Skipped));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Invalid options or name; the lock service's errors (the job did not
    /// run); [`Error::NotHeld`](crate::Error::NotHeld) when the run was cancelled because its lease
    /// was lost or `at_most` passed (the rule of every body under a lock:
    /// see [`Finished`]).
    pub async fn run_job<T>(
        &self,
        name: &str,
        opts: &JobOptions,
        job: impl AsyncFnOnce(&Guard) -> T,
    ) -> Result<JobOutcome<T>> {
        let Some(run) = JobLock::take(self, name, opts).await? else {
            return Ok(JobOutcome::Skipped);
        };
        let value = run.guarded(job(&run.guard)).await;
        let keep = run.at_least;
        let release = run.finish(keep).await;
        Ok(JobOutcome::Ran(Finished {
            value: value?,
            release,
        }))
    }
}
