//! dlock's traces and metrics: a tracing subscriber prints the debug span of
//! every lock call (backend, lock name, outcome, fencing token, time taken)
//! and the warnings of guards, and a Prometheus exporter renders the
//! metrics of the `metrics` feature.
//!
//! ```sh
//! cargo run -p dlock-rs --example observability              # in-memory locks
//! cargo run -p dlock-rs --example observability redis://127.0.0.1:6379
//! ```

use std::process::ExitCode;
use std::time::Duration;

use dlock::LockOptions;
use metrics_exporter_prometheus::PrometheusBuilder;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(LevelFilter::DEBUG)
        .with_target(false)
        // A line per finished call, with the fields recorded on its span.
        .with_span_events(FmtSpan::CLOSE)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("observability: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locker = dlock::connect(&url).await?;
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .wait(Duration::from_millis(200));
    let guard = locker.acquire("report:nightly", &opts).await?;

    // Another task finds it held, then waits in vain.
    let other = locker.clone();
    let waited = tokio::spawn(async move {
        assert!(other.try_acquire("report:nightly", &opts).await?.is_none());
        other.acquire("report:nightly", &opts).await.map(drop)
    });
    assert!(waited.await?.is_err());
    // Long enough for the guard to renew its lease twice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.release().await?;

    println!("{}", prometheus.render());
    Ok(())
}
