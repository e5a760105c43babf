use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::{JobLock, JobOptions, Schedule};
use crate::driver::check_duration;
use crate::{Locker, Result};

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

    /// Resolves when the run's lease is lost (see [`Guard::lost`](crate::Guard::lost)).
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Whether the run's lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// What a [`ScheduledJob`]'s run returns: `()`, or a `Result` whose `Err`
/// counts the run as failed ([`RunReport::failed`]) and is logged.
///
/// ```
/// # async fn f(job: dlock_core::ScheduledJob) -> dlock_core::Result<()> {
/// let shutdown = dlock_core::CancellationToken::new();
/// job.run(shutdown, |run| async move {
///     if run.fencing_token() == 0 {
///         return Err("no token");
///     }
///     Ok(())
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub trait RunResult {
    /// Why the run failed, if it did.
    fn failure(self) -> Option<String>;
}

impl RunResult for () {
    fn failure(self) -> Option<String> {
        None
    }
}

impl<T, E: std::fmt::Display> RunResult for std::result::Result<T, E> {
    fn failure(self) -> Option<String> {
        self.err().map(|e| e.to_string())
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
    /// Occurrences that could not be locked, whose run was cancelled
    /// because its lease was lost, or whose run returned an error
    /// ([`RunResult`]).
    pub failed: u64,
    /// Occurrences this node did not get to in time, left to the others:
    /// those that came due while it was still busy with an earlier one (or
    /// stalled), and those it got to after their lock would have been
    /// released by a node that ran them on time (see
    /// [`ScheduledJob::run`]): a free lock then proves nothing. Never the
    /// second kind with an `at_least` of zero.
    pub late: u64,
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

    /// Starts each run this long after it is due (before the jitter). Give
    /// every node the same delay: a node counts from the due time plus its
    /// own delay to tell whether it came too late ([`RunReport::late`]).
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
    /// running the previous one is left to the other nodes.
    ///
    /// With a non-zero [`JobOptions::at_least`], each occurrence's lock is
    /// kept after its run: until `at_most` ([`JobOptions::new`]) after the start on
    /// a backend that keeps a released lock itself (every bundled one:
    /// the name is used once, so keeping it costs nothing but a key, row or
    /// node until then), else for `at_least` by this node. A node whose
    /// timer fires late, or whose acquire is slow, by less than that finds
    /// the occurrence taken; one that gets to it later still skips it
    /// ([`RunReport::late`]), since by then a free lock may be one whose run
    /// is over. So an occurrence runs at most once, assuming the nodes'
    /// clocks agree to within that time, and is missed only when every
    /// node is that late. Give every node the same `delay`. Shutdown is
    /// graceful: a run in progress finishes, and its lock is released
    /// (kept as above), before this returns.
    ///
    /// # Errors
    /// Only for bad settings (name, options, schedule), before anything
    /// runs. Failures of single occurrences (a run that returns an error
    /// included: see [`RunResult`]) are logged and counted in the report.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, mut job: F) -> Result<RunReport>
    where
        F: FnMut(JobRun) -> Fut,
        Fut: Future<Output: RunResult>,
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
            report.late += self.due_between(due, cursor);
        }
    }

    /// How long after its start an occurrence's lock is kept. Its name is
    /// used once, so with a server that keeps a released lock
    /// ([`Capabilities::delayed_release`](crate::Capabilities::delayed_release))
    /// it is kept for `at_most`, the longest a run may take: a node whose
    /// timer or acquire comes late by anything less finds it taken. Else
    /// this node keeps it itself, for `at_least`. With an `at_least` of
    /// zero, not at all.
    fn keep(&self) -> Duration {
        let at_least = self.opts.get_at_least();
        if at_least.is_zero() || !self.locker.backend().capabilities().delayed_release {
            return at_least;
        }
        self.opts.get_at_most().max(at_least)
    }

    /// Occurrences due after `from` up to `to`, counted up to a bound (a
    /// stall of hours on a short period is still late, not a loop).
    fn due_between(&self, from: SystemTime, to: SystemTime) -> u64 {
        let mut count = 0;
        let mut at = from;
        while count < 10_000 {
            match self.schedule.next_after(at) {
                Some(next) if next <= to && self.until.is_none_or(|until| next < until) => {
                    count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        count
    }

    pub(super) async fn occurrence<F, Fut>(
        &self,
        due: SystemTime,
        job: &mut F,
        report: &mut RunReport,
    ) where
        F: FnMut(JobRun) -> Fut,
        Fut: Future<Output: RunResult>,
    {
        let lock = self.lock_name(due);
        // A node on time keeps the occurrence's lock until `keep` after its
        // start; past that, a free lock may be one whose run is over.
        let keep = self.keep();
        let late = !keep.is_zero()
            && due
                .checked_add(self.delay.saturating_add(keep))
                .is_some_and(|latest| SystemTime::now() > latest);
        if late {
            tracing::warn!(lock, "occurrence got to after its lock's keep: skipped");
            report.late += 1;
            return;
        }
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
        let done = run.guarded(job(info)).await;
        // A failed release is logged there; the run stands.
        let _ = run.finish(keep).await;
        match done.map(RunResult::failure) {
            Ok(None) => {
                tracing::info!(lock, "occurrence ran");
                report.ran += 1;
            }
            Ok(Some(error)) => {
                tracing::warn!(lock, error, "occurrence failed");
                report.failed += 1;
            }
            Err(_) => report.failed += 1,
        }
    }
}
