//! A job that every node schedules every 10 seconds and one node runs per
//! occurrence. Start it in several terminals against one server and watch
//! each occurrence run once:
//!
//! ```sh
//! cargo run -p dlock-rs --example scheduled_job -- redis://127.0.0.1:6379
//! cargo run -p dlock-rs --example scheduled_job -- "zk://127.0.0.1:2181" "*/15 * * * * *"
//! ```
//!
//! The first argument is the lock service (default `memory://`), the
//! optional second a cron expression (seconds first) instead of the
//! 10-second period, the optional third how many seconds to run. Ctrl-C
//! stops it after the run in progress.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use dlock::{CancellationToken, JobOptions, Schedule, ScheduledJob};

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".to_owned());
    let schedule = match args.next().filter(|e| e != "-") {
        Some(expression) => match Schedule::cron(&expression) {
            Ok(schedule) => schedule,
            Err(e) => {
                eprintln!("scheduled_job: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => Schedule::every(Duration::from_secs(10)),
    };
    let locker = match dlock::connect(&url).await {
        Ok(locker) => locker,
        Err(e) => {
            eprintln!("scheduled_job: {e}");
            return ExitCode::FAILURE;
        }
    };
    let job = ScheduledJob::new(
        locker,
        "example:report",
        schedule,
        // A dead node's run frees the lock after a minute; an early finish
        // keeps it 5 s, more than the nodes' clocks and timers differ.
        JobOptions::new(Duration::from_secs(60)).at_least(Duration::from_secs(5)),
    )
    .jitter(Duration::from_millis(500));
    let job = match args.next().map(|s| s.parse::<u64>()) {
        Some(Ok(secs)) => job.until(SystemTime::now() + Duration::from_secs(secs)),
        Some(Err(e)) => {
            eprintln!("scheduled_job: how many seconds to run: {e}");
            return ExitCode::FAILURE;
        }
        None => job,
    };
    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });
    let report = job
        .run(shutdown, |run| async move {
            println!(
                "running {} (fencing token {})",
                run.lock_name(),
                run.fencing_token()
            );
            // Cancelled (dropped) at once if the lease is lost.
            tokio::time::sleep(Duration::from_millis(200)).await;
            println!("done");
        })
        .await;
    match report {
        Ok(report) => {
            println!(
                "this node ran {}, skipped {} (taken) and {} (late), failed {}",
                report.ran, report.skipped, report.late, report.failed
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scheduled_job: {e}");
            ExitCode::FAILURE
        }
    }
}
