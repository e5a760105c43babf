//! A backend with settings, two ways: the driver's builder, and the same
//! settings in the URL, which is how `dlock::connect`, the CLI's `--url`
//! and `DLOCK_URL` take them (each driver's README lists its own). Both
//! lockers below use the same key prefix, so they see each other's locks.
//!
//! ```sh
//! cargo run -p dlock-rs --features redis --example builder -- redis://127.0.0.1:6379
//! ```

use std::process::ExitCode;
use std::time::Duration;

use dlock::redis::RedisBackend;
use dlock::{LockOptions, Locker};

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("builder: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let backend = RedisBackend::builder(url)
        .prefix("billing:locks:")
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    // Keep one locker per backend, and clone it where locks are taken.
    let locker = Locker::new(backend);

    // The same settings in the URL's query; a misspelt one is refused.
    let same = dlock::connect(&format!(
        "{url}?prefix=billing:locks:&request_timeout=500ms"
    ))
    .await?;
    let typo = dlock::connect(&format!("{url}?request_timout=500ms")).await;
    println!("a misspelt setting: {}", typo.err().ok_or("was accepted")?);

    let opts = LockOptions::new().holder("billing-worker-1");
    let guard = locker.acquire("invoice-run", &opts).await?;
    let seen = same.inspect("invoice-run").await?.ok_or("not seen")?;
    println!(
        "held by {:?} with fencing token {}",
        seen.holder, seen.fencing_token
    );
    guard.release().await?;
    Ok(())
}
