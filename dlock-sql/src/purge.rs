//! Deleting rows whose lease ended long ago, in the background: each name
//! keeps its row after release, so a table of per-entity names grows.

use std::future::Future;
use std::time::Duration;

use dlock_core::driver::{MAX_SETTING, check_duration};
use dlock_core::{Error, Result};

/// How long a row must have been expired before a purge may delete it:
/// the database clock may step back by less than this without a purged
/// name's next token falling below its last (the Redis driver keeps its
/// counter as long).
pub const MIN_PURGE_AGE: Duration = Duration::from_secs(60 * 60);

/// A background purge task (a SQL backend's `spawn_purger`); dropping it
/// stops the task.
#[derive(Debug)]
pub struct Purger(tokio::task::AbortHandle);

impl Drop for Purger {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// [`Error::InvalidOption`] for a purge age under [`MIN_PURGE_AGE`] (or
/// beyond any sensible one).
pub fn check_purge_age(older_than: Duration) -> Result<()> {
    check_duration("older_than", older_than, MIN_PURGE_AGE, MAX_SETTING * 365)
}

/// Runs `purge(limit)` every `every` (jittered) on a spawned task, in
/// batches of 1,000 while batches come back full, until the returned
/// handle is dropped; failures are logged and tried again at the next
/// round.
///
/// # Errors
/// [`Error::InvalidOption`] when `every` is under a second.
pub fn spawn_purger<F, Fut>(every: Duration, purge: F) -> Result<Purger>
where
    F: Fn(u32) -> Fut + Send + 'static,
    Fut: Future<Output = Result<u64>> + Send,
{
    if every < Duration::from_secs(1) {
        return Err(Error::invalid_option(
            "every",
            format!("must be at least 1s, got {every:?}"),
        ));
    }
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(dlock_core::driver::wait::jitter(every)).await;
            loop {
                match purge(1000).await {
                    Ok(1000) => continue,
                    Ok(n) => tracing::debug!(deleted = n, "purged expired lock rows"),
                    Err(e) => tracing::warn!(error = %e, "purging expired lock rows failed"),
                }
                break;
            }
        }
    });
    Ok(Purger(task.abort_handle()))
}
