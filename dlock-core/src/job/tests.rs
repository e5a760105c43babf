use std::sync::{Arc, Mutex};

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{Error, MemoryBackend};

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
    assert!(matches!(
        ran,
        JobOutcome::Ran(Finished {
            release: Ok(()),
            ..
        })
    ));
    tokio::time::advance(Duration::from_secs(4)).await;
    let again = locker.run_job("j", &opts, async |_| ()).await.unwrap();
    assert!(matches!(again, JobOutcome::Skipped));
    tokio::time::advance(Duration::from_secs(2)).await;
    let later = locker.run_job("j", &opts, async |_| ()).await.unwrap();
    assert!(matches!(
        later,
        JobOutcome::Ran(Finished {
            release: Ok(()),
            ..
        })
    ));
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
    assert!(matches!(
        next,
        JobOutcome::Ran(Finished {
            release: Ok(()),
            ..
        })
    ));
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
    let mut late = u64::MAX;
    for node in nodes {
        let report = node.await.unwrap();
        assert_eq!(report.failed, 0);
        ran += report.ran;
        late = late.min(report.late);
    }
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    let len = runs.len();
    runs.dedup();
    assert_eq!(runs.len(), len, "an occurrence ran twice");
    assert_eq!(ran as usize, runs.len());
    // An occurrence not run is one every node got to late (a stalled
    // runtime): each node counted it. Some must run, or lateness is all
    // that was tested.
    assert!(ran > 0, "no occurrence ran");
    assert!(
        8 - ran <= late,
        "{} occurrences not run, and a node was late for only {late}",
        8 - ran
    );
}

#[tokio::test]
async fn an_occurrence_got_to_after_at_least_is_skipped_not_run() {
    let at_least = Duration::from_millis(200);
    let job = ScheduledJob::new(
        Locker::new(MemoryBackend::new()),
        "late",
        Schedule::every(Duration::from_secs(1)),
        JobOptions::new(Duration::from_secs(5)).at_least(at_least),
    );
    let ran = Arc::new(Mutex::new(0));
    let mut job_fn = |_| {
        let ran = ran.clone();
        async move { *ran.lock().unwrap() += 1 }
    };
    let mut report = RunReport::default();
    // Its lock is free, but an on-time node's hold would have ended.
    let due = SystemTime::now() - Duration::from_secs(3600);
    job.occurrence(due, &mut job_fn, &mut report).await;
    assert_eq!((*ran.lock().unwrap(), report.late), (0, 1));
    // Not late (due later than now: however slow this machine), it runs.
    let later = SystemTime::now() + Duration::from_secs(3600);
    job.occurrence(later, &mut job_fn, &mut report).await;
    assert_eq!((*ran.lock().unwrap(), report.ran, report.late), (1, 1, 1));
    // With no at_least, a free lock is all there is to go by.
    let eager = ScheduledJob::new(
        Locker::new(MemoryBackend::new()),
        "eager",
        Schedule::every(Duration::from_secs(1)),
        JobOptions::new(Duration::from_secs(5)),
    );
    eager.occurrence(due, &mut job_fn, &mut report).await;
    assert_eq!((*ran.lock().unwrap(), report.late), (2, 1));
}

#[tokio::test]
async fn a_run_that_returns_an_error_counts_as_failed() {
    let job = ScheduledJob::new(
        Locker::new(MemoryBackend::new()),
        "fails",
        Schedule::every(Duration::from_secs(1)),
        JobOptions::new(Duration::from_secs(5)),
    );
    let mut report = RunReport::default();
    let soon = SystemTime::now() + Duration::from_secs(3600);
    let mut failing = |_| async { Err::<(), _>("disk full") };
    job.occurrence(soon, &mut failing, &mut report).await;
    let mut fine = |_| async { Ok::<_, String>(()) };
    job.occurrence(soon + Duration::from_secs(1), &mut fine, &mut report)
        .await;
    assert_eq!((report.ran, report.failed), (1, 1), "{report:?}");
}
