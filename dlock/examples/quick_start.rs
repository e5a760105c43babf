//! The quick start of the crate's README, run for real: a mutex on Redis,
//! `select!` on `guard.lost()`, and a fenced write to PostgreSQL, whose row
//! keeps the highest fencing token it has seen and so refuses an older
//! holder's write. Makes the `accounts` table with the row it writes to
//! when it is missing.
//!
//! ```sh
//! cargo run -p dlock-rs --example quick_start -- redis://127.0.0.1:6379 postgres://postgres@127.0.0.1:5432/postgres
//! ```

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(redis), Some(postgres)) = (args.next(), args.next()) else {
        eprintln!("usage: quick_start <redis URL> <postgres URL>");
        return ExitCode::from(2);
    };
    match run(&redis, &postgres).await {
        Ok(token) => {
            println!("wrote with fencing token {token}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quick_start: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(redis: &str, postgres: &str) -> Result<i64, Box<dyn std::error::Error>> {
    let db = sqlx::PgPool::connect(postgres).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS accounts \
             (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT NOT NULL); \
         INSERT INTO accounts VALUES (42, 1000, 0) ON CONFLICT DO NOTHING",
    )
    .execute(&db)
    .await?;

    // From here on, the README's block (its test compares them), but for
    // the URL it connects to.
    use dlock::LockOptions;
    use std::time::Duration;

    let locker = dlock::connect(redis).await?;
    // `LockOptions::new()` alone: a 30 s TTL renewed by the guard, and no wait
    // bound (`acquire` waits as long as it takes).
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(5));
    let guard = locker.acquire("account:42", &opts).await?;
    let token = i64::try_from(guard.fencing_token())?;
    tokio::select! {
        // Stop: another node may hold the lock now.
        () = guard.lost() => return Err("lost the lock".into()),
        written = sqlx::query(
            // The row keeps the highest token it has seen; an older holder's
            // write matches nothing.
            "UPDATE accounts SET balance = balance - 10, fence = $1 WHERE id = 42 AND fence <= $1",
        )
        .bind(token)
        .execute(&db) => {
            if written?.rows_affected() == 0 {
                return Err("a newer holder of the lock wrote first".into());
            }
        }
    }
    guard.release().await?;
    Ok(token)
}
