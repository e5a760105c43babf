//! Leader election: two candidates, as two nodes would be, campaign for one
//! election. Each leads for a short term, passing its term's fencing token
//! to what it writes, then resigns, and the other leads at once, without
//! waiting for the term's TTL.
//!
//! ```sh
//! cargo run -p dlock-rs --features redis --example election -- redis://127.0.0.1:6379
//! ```

use std::process::ExitCode;
use std::time::Duration;

use dlock::{Election, LockOptions, OnLost};

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("election: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("example:controller:{}", std::process::id());
    let mut nodes = Vec::new();
    for identity in ["node-a", "node-b"] {
        // A locker per node: in production, one per process.
        let locker = dlock::connect(url).await?;
        let election = Election::new(locker, name.clone(), identity)
            .options(LockOptions::new().ttl(Duration::from_secs(10)));
        nodes.push(tokio::spawn(async move {
            election
                .lead(OnLost::Rejoin, |term| async move {
                    println!("{identity} leads, term {}", term.fencing_token());
                    // The leader's work, cancelled at once if the term is
                    // lost; its writes carry term.fencing_token().
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    println!("{identity} resigns, term {}", term.fencing_token());
                })
                .await
        }));
    }
    for node in nodes {
        // The term's work ran; a failed resignation only leaves the term
        // to end with its TTL.
        node.await??.into_result()?;
    }
    let observer = Election::new(dlock::connect(url).await?, name, "observer");
    println!("leader now: {:?}", observer.leader().await?);
    Ok(())
}
