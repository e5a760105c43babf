//! A cron line that runs a script on one machine of many, with the `dlock`
//! command (`cargo install --path dlock-cli`). Each machine's crontab has
//! the same line; whichever machine's cron fires first runs the script,
//! the others exit 75 ("held") at once, and `--at-least` keeps the lock
//! for 2 minutes so that a machine whose clock is a little behind does not
//! run it again:
//!
//! ```text
//! DLOCK_URL=redis://locks.internal:6379
//! 0 3 * * * dlock run --name nightly-backup --ttl 1m --at-least 2m -- /usr/local/bin/backup.sh
//! ```
//!
//! The script runs with DLOCK_LOCK_NAME and DLOCK_FENCING_TOKEN set. If the
//! lease is lost (the lock service unreachable past the TTL) the script gets
//! SIGTERM, then SIGKILL after `--grace`, and dlock exits 76.
//!
//! This program runs such a line three times at once, as three machines
//! would, and prints which one ran:
//!
//! ```sh
//! cargo build -p dlock-cli
//! cargo run -p dlock-rs --example cron_line -- redis://127.0.0.1:6379 target/debug/dlock
//! ```

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(dlock)) = (args.next(), args.next()) else {
        eprintln!("usage: cron_line URL PATH-TO-DLOCK");
        return ExitCode::FAILURE;
    };
    let name = format!("example-backup-{:08x}", fastrand::u32(..));
    let machines = ["alpha", "beta", "gamma"].map(|machine| {
        tokio::process::Command::new(&dlock)
            .args([
                "run",
                "--url",
                &url,
                "--name",
                &name,
                "--at-least",
                "2s",
                "--",
            ])
            .args([
                "sh",
                "-c",
                &format!("echo {machine} runs the backup; sleep 1"),
            ])
            .status()
    });
    for (machine, status) in ["alpha", "beta", "gamma"].iter().zip(machines) {
        match status.await {
            Ok(status) => match status.code() {
                Some(0) => println!("{machine}: ran"),
                Some(75) => println!("{machine}: held by another machine, skipped"),
                other => println!("{machine}: exited {other:?}"),
            },
            Err(e) => {
                eprintln!("cron_line: cannot run {dlock}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
