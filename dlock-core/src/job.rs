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
//! the occurrence taken instead of running it again.
//!
//! [`Locker::run_job`] runs one occurrence; [`ScheduledJob`] runs a job on
//! a [`Schedule`] (a fixed period, or a cron expression with the `cron`
//! feature), one lock per occurrence: `<job>@<scheduled time in Unix ms>`.
//! Those names are used once: on Redis they expire, on ZooKeeper the
//! releasing node cleans up, and on MySQL each leaves a row, which the
//! driver's purger (`MySqlBackend::spawn_purger`) deletes after an hour.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::options::deadline_after;
use crate::{Error, Guard, LockOptions, Locker, MAX_TTL, MIN_TTL, Result, check_duration};

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
    cancel_on_lost: bool,
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
            cancel_on_lost: true,
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

    /// Whether a run is cancelled (its future dropped) the moment its lease
    /// is lost (default `true`). With `false` the run goes on and should
    /// watch [`Guard::lost`] (or [`JobRun::lost`]) itself.
    pub fn cancel_on_lost(mut self, cancel: bool) -> Self {
        self.cancel_on_lost = cancel;
        self
    }

    /// The longest a run holds its lock.
    pub fn at_most_value(&self) -> Duration {
        self.at_most
    }

    /// The shortest time a run's lock is held.
    pub fn at_least_value(&self) -> Duration {
        self.at_least
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `at_most` is not a valid TTL or
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
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome<T> {
    /// This node ran it; the job's value.
    Ran(T),
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
    /// assert_eq!(first, JobOutcome::Ran(42));
    /// // Within `at_least`, the occurrence counts as taken.
    /// let again = locker.run_job("invoices@2026-11-22", &opts, async |_guard| 43).await?;
    /// assert_eq!(again, JobOutcome::Skipped);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Invalid options or name; the lock service's errors (the job did not
    /// run); [`Error::NotHeld`] when the run was cancelled because its lease
    /// was lost or `at_most` passed.
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
        run.finish().await;
        match value {
            Some(value) => Ok(JobOutcome::Ran(value)),
            None => Err(Error::NotHeld {
                name: name.to_owned(),
            }),
        }
    }
}

/// A run's lock, from the grant to the (possibly delayed) release.
struct JobLock {
    guard: Guard,
    started: Instant,
    /// When `at_most` ends the run: the lease's validity, or on session
    /// backends the start plus `at_most`.
    deadline: Instant,
    at_least: Duration,
    cancel_on_lost: bool,
    delayed_release: bool,
}

impl JobLock {
    async fn take(locker: &Locker, name: &str, opts: &JobOptions) -> Result<Option<JobLock>> {
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
    async fn guarded<F: Future>(&self, job: F) -> Option<F::Output> {
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
    async fn finish(self) {
        let name = self.guard.name().to_owned();
        let hold = self.at_least.saturating_sub(self.started.elapsed());
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

/// When a job's occurrences are due. All times are UTC wall-clock times,
/// the same on every node whose clock is synchronised.
#[derive(Debug, Clone)]
pub struct Schedule(Kind);

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// Every `period`, at the multiples of it since the Unix epoch, so that
    /// every node computes the same occurrences (`every(1 hour)` is due on
    /// the hour).
    pub fn every(period: Duration) -> Schedule {
        Schedule(Kind::Every(period))
    }

    /// A cron expression, evaluated in UTC: five fields (minute hour
    /// day-of-month month day-of-week) or six with seconds first, with the
    /// usual ranges, lists, steps, names and `@hourly`-style nicknames.
    ///
    /// ```
    /// let nightly = dlock_core::Schedule::cron("30 2 * * *").unwrap();
    /// assert!(dlock_core::Schedule::cron("61 * * * *").is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (`schedule`) with the parser's reason.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron(expression: &str) -> Result<Schedule> {
        let cron = croner::parser::CronParser::new()
            .parse(expression)
            .map_err(|e| Error::invalid_option("schedule", format!("{expression:?}: {e}")))?;
        Ok(Schedule(Kind::Cron(Box::new(cron))))
    }

    /// The first occurrence strictly after `t`; `None` when there is none.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.0 {
            Kind::Every(period) => {
                let period = period.as_nanos();
                if period == 0 {
                    return None;
                }
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let next = (since / period).checked_add(1)?.checked_mul(period)?;
                let secs = u64::try_from(next / 1_000_000_000).ok()?;
                // The remainder of a division by 10^9 fits.
                let nanos = u32::try_from(next % 1_000_000_000).ok()?;
                UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
            }
            #[cfg(feature = "cron")]
            Kind::Cron(cron) => {
                let from = chrono::DateTime::<chrono::Utc>::from(t);
                let next = cron.find_next_occurrence(&from, false).ok()?;
                Some(SystemTime::from(next))
            }
        }
    }

    fn validate(&self) -> Result<()> {
        match &self.0 {
            Kind::Every(period) => {
                check_duration("schedule", *period, Duration::from_millis(1), Duration::MAX)
            }
            #[cfg(feature = "cron")]
            Kind::Cron(_) => Ok(()),
        }
    }
}

/// One run of a [`ScheduledJob`], as its job sees it.
#[derive(Debug, Clone)]
pub struct JobRun {
    lock: String,
    scheduled: SystemTime,
    fencing_token: u64,
    lost: CancellationToken,
}

impl JobRun {
    /// The occurrence's lock name, `<job>@<scheduled Unix ms>`.
    pub fn lock_name(&self) -> &str {
        &self.lock
    }

    /// When the occurrence was due.
    pub fn scheduled(&self) -> SystemTime {
        self.scheduled
    }

    /// The fencing token to pass to what the run writes.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Resolves when the run's lease is lost (see [`Guard::lost`]).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Whether the run's lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// What [`ScheduledJob::run`] did on this node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Occurrences this node ran to the end.
    pub ran: u64,
    /// Occurrences another node had taken.
    pub skipped: u64,
    /// Occurrences that could not be locked, or whose run was cancelled
    /// because its lease was lost.
    pub failed: u64,
}

/// A job run on a [`Schedule`] by every node that runs this code, each
/// occurrence by one node only.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use std::time::Duration;
/// use dlock_core::{CancellationToken, JobOptions, Locker, MemoryBackend, Schedule, ScheduledJob};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let job = ScheduledJob::new(
///     locker,
///     "cleanup",
///     Schedule::every(Duration::from_millis(50)),
///     JobOptions::new(Duration::from_secs(10)),
/// );
/// let shutdown = CancellationToken::new();
/// let stop = shutdown.clone();
/// tokio::spawn(async move {
///     tokio::time::sleep(Duration::from_millis(180)).await;
///     stop.cancel();
/// });
/// let report = job.run(shutdown, |run| async move {
///     println!("cleaning up for {:?} with token {}", run.scheduled(), run.fencing_token());
/// }).await?;
/// assert!(report.ran >= 2);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ScheduledJob {
    locker: Locker,
    name: String,
    schedule: Schedule,
    opts: JobOptions,
    delay: Duration,
    jitter: Duration,
    starting: Option<SystemTime>,
    until: Option<SystemTime>,
}

impl ScheduledJob {
    /// The job `name` on `schedule`, each run locked with `opts`.
    pub fn new(
        locker: Locker,
        name: impl Into<String>,
        schedule: Schedule,
        opts: JobOptions,
    ) -> Self {
        ScheduledJob {
            locker,
            name: name.into(),
            schedule,
            opts,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            starting: None,
            until: None,
        }
    }

    /// Starts each run a random time between zero and `max` after it is
    /// due, so that the nodes do not all call the lock service at once.
    /// At most [`JobOptions::at_least`], which must cover it ([`run`](Self::run)
    /// checks).
    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter = max;
        self
    }

    /// Starts each run this long after it is due (before the jitter).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Only occurrences due at or after `t` (default: from now on).
    pub fn starting(mut self, t: SystemTime) -> Self {
        self.starting = Some(t);
        self
    }

    /// Only occurrences due before `t`: [`run`](Self::run) returns after
    /// the last one.
    pub fn until(mut self, t: SystemTime) -> Self {
        self.until = Some(t);
        self
    }

    /// The lock name of the occurrence due at `at`: `<job>@<Unix ms>`.
    pub fn lock_name(&self, at: SystemTime) -> String {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!("{}@{ms}", self.name)
    }

    /// Runs the job at each occurrence until `shutdown` is cancelled (or
    /// [`until`](Self::until) is reached). An occurrence that another node
    /// took is skipped; one that came due while this node was still
    /// running the previous one is left to the other nodes. Shutdown is
    /// graceful: a run in progress finishes, and its lock is released
    /// (keeping `at_least`), before this returns.
    ///
    /// # Errors
    /// Only for bad settings (name, options, schedule), before anything
    /// runs. Failures of single occurrences are logged and counted in the
    /// report.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, mut job: F) -> Result<RunReport>
    where
        F: FnMut(JobRun) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.opts.validate()?;
        self.schedule.validate()?;
        // Nodes start up to `jitter` apart: a node that finished before
        // another one started would leave it the occurrence to run again.
        check_duration("jitter", self.jitter, Duration::ZERO, self.opts.at_least)?;
        crate::validate_name(&self.lock_name(UNIX_EPOCH + Duration::from_secs(u32::MAX.into())))?;
        let mut report = RunReport::default();
        let now = SystemTime::now();
        let mut cursor = match self.starting {
            Some(t) => t.checked_sub(Duration::from_nanos(1)).unwrap_or(t).max(now),
            None => now,
        };
        loop {
            let Some(due) = self.schedule.next_after(cursor) else {
                return Ok(report);
            };
            if self.until.is_some_and(|until| due >= until) {
                return Ok(report);
            }
            let jitter = Duration::from_nanos(fastrand::u64(
                ..=u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX),
            ));
            let start = due + self.delay.saturating_add(jitter);
            let wait = start.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::select! {
                () = shutdown.cancelled() => return Ok(report),
                () = sleep(wait) => {}
            }
            self.occurrence(due, &mut job, &mut report).await;
            // Occurrences that came due meanwhile are left to other nodes.
            cursor = due.max(SystemTime::now());
        }
    }

    async fn occurrence<F, Fut>(&self, due: SystemTime, job: &mut F, report: &mut RunReport)
    where
        F: FnMut(JobRun) -> Fut,
        Fut: Future<Output = ()>,
    {
        let lock = self.lock_name(due);
        let run = match JobLock::take(&self.locker, &lock, &self.opts).await {
            Ok(Some(run)) => run,
            Ok(None) => {
                tracing::debug!(lock, "occurrence taken by another node: skipped");
                report.skipped += 1;
                return;
            }
            Err(e) => {
                tracing::warn!(lock, error = %e, "could not lock the occurrence: not run");
                report.failed += 1;
                return;
            }
        };
        let info = JobRun {
            lock: lock.clone(),
            scheduled: due,
            fencing_token: run.guard.fencing_token(),
            lost: run.guard.lost_token(),
        };
        let finished = run.guarded(job(info)).await.is_some();
        run.finish().await;
        if finished {
            tracing::info!(lock, "occurrence ran");
            report.ran += 1;
        } else {
            report.failed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::MemoryBackend;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn periods_are_aligned_to_the_epoch() {
        let every = Schedule::every(Duration::from_secs(60));
        assert_eq!(every.next_after(at(0)), Some(at(60_000)));
        assert_eq!(every.next_after(at(59_999)), Some(at(60_000)));
        assert_eq!(every.next_after(at(60_000)), Some(at(120_000)));
        assert!(Schedule::every(Duration::ZERO).validate().is_err());
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_expressions_give_utc_occurrences() {
        // 2026-11-22T00:00:00Z
        let midnight = at(1_795_305_600_000);
        let nightly = Schedule::cron("30 2 * * *").unwrap();
        assert_eq!(
            nightly.next_after(midnight),
            Some(midnight + Duration::from_secs(2 * 3600 + 30 * 60))
        );
        let every_ten_seconds = Schedule::cron("*/10 * * * * *").unwrap();
        assert_eq!(
            every_ten_seconds.next_after(midnight),
            Some(midnight + Duration::from_secs(10))
        );
        for bad in ["", "61 * * * *", "* * *", "nonsense"] {
            let e = Schedule::cron(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidOption {
                        option: "schedule",
                        ..
                    }
                ),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn job_options_are_checked() {
        let at_most = Duration::from_secs(10);
        assert!(JobOptions::new(at_most).validate().is_ok());
        assert!(JobOptions::new(Duration::ZERO).validate().is_err());
        assert!(
            JobOptions::new(at_most)
                .at_least(at_most * 2)
                .validate()
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_least_keeps_an_early_finish_locked() {
        let locker = Locker::new(MemoryBackend::new());
        let opts = JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(5));
        let ran = locker.run_job("j", &opts, async |_| ()).await.unwrap();
        assert_eq!(ran, JobOutcome::Ran(()));
        tokio::time::advance(Duration::from_secs(4)).await;
        let again = locker.run_job("j", &opts, async |_| ()).await.unwrap();
        assert_eq!(again, JobOutcome::Skipped);
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = locker.run_job("j", &opts, async |_| ()).await.unwrap();
        assert_eq!(later, JobOutcome::Ran(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_past_at_most_is_cancelled() {
        let locker = Locker::new(MemoryBackend::new());
        let opts = JobOptions::new(Duration::from_secs(1));
        let r = locker
            .run_job("slow", &opts, async |_| sleep(Duration::from_secs(5)).await)
            .await;
        assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
        // Cancelled and released: the next run need not wait.
        let next = locker.run_job("slow", &opts, async |_| ()).await.unwrap();
        assert_eq!(next, JobOutcome::Ran(()));
    }

    #[tokio::test]
    async fn three_nodes_run_each_occurrence_once() {
        let backend = MemoryBackend::new();
        let period = Duration::from_millis(100);
        let start = SystemTime::now() + Duration::from_millis(100);
        let until = start + period * 8;
        let runs = Arc::new(Mutex::new(Vec::new()));
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let job = ScheduledJob::new(
                Locker::new(backend.clone()),
                "tick",
                Schedule::every(period),
                JobOptions::new(Duration::from_secs(5)).at_least(period / 2),
            )
            .jitter(Duration::from_millis(10))
            .starting(start)
            .until(until);
            let runs = runs.clone();
            nodes.push(tokio::spawn(async move {
                job.run(CancellationToken::new(), move |run| {
                    let runs = runs.clone();
                    async move { runs.lock().unwrap().push(run.scheduled()) }
                })
                .await
                .unwrap()
            }));
        }
        let mut ran = 0;
        for node in nodes {
            let report = node.await.unwrap();
            assert_eq!(report.failed, 0);
            ran += report.ran;
        }
        let mut runs = runs.lock().unwrap().clone();
        runs.sort();
        let len = runs.len();
        runs.dedup();
        assert_eq!(runs.len(), len, "an occurrence ran twice");
        assert_eq!(ran, 8);
        assert_eq!(runs.len(), 8);
    }
}
