//! A method locked by its argument with `#[dlock::locked]`: concurrent
//! calls for one order run one at a time (on every node that shares the
//! lock service), calls for different orders run side by side.
//!
//! ```sh
//! cargo run -p dlock-rs --example order_method                       # in-memory
//! cargo run -p dlock-rs --example order_method -- redis://127.0.0.1:6379
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock::Locker;

/// What shipping can fail with; lock errors convert into it.
#[derive(Debug)]
enum ShipError {
    Lock(dlock::Error),
}

impl From<dlock::Error> for ShipError {
    fn from(e: dlock::Error) -> Self {
        ShipError::Lock(e)
    }
}

impl std::fmt::Display for ShipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShipError::Lock(e) => write!(f, "could not lock the order: {e}"),
        }
    }
}

struct Warehouse {
    locker: Locker,
}

impl Warehouse {
    /// Ships an order once at a time. `lease` is the guard: its fencing
    /// token goes with the write, so that a store that saw a newer token
    /// refuses a holder whose lease ended.
    #[dlock::locked(locker = self.locker, name = "order:{order_id}", wait = "10s", ttl = "30s", guard = lease)]
    async fn ship(&self, order_id: u64, caller: &str) -> Result<u64, ShipError> {
        println!(
            "{caller}: shipping order {order_id} with fencing token {}",
            lease.fencing_token()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!("{caller}: order {order_id} shipped");
        Ok(lease.fencing_token())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locker = match dlock::connect(&url).await {
        Ok(locker) => locker,
        Err(e) => {
            eprintln!("order_method: {e}");
            return ExitCode::FAILURE;
        }
    };
    let warehouse = Arc::new(Warehouse { locker });
    let calls = [(1, "a"), (1, "b"), (2, "c")].map(|(order, caller)| {
        let warehouse = warehouse.clone();
        tokio::spawn(async move { warehouse.ship(order, caller).await })
    });
    for call in calls {
        match call.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                eprintln!("order_method: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("order_method: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
