//! Deleting rows whose lease ended long ago, on demand or in the
//! background: each name keeps its row after release, so a table of
//! per-entity names grows.

use std::time::Duration;

use dlock_core::driver::{MAX_SETTING, check_duration};
use dlock_core::{Error, Result};
use tokio::time::{sleep, timeout_at};

use crate::backend::MySqlBackend;
use crate::pool::settle;
use dlock_core::driver::micros_up;

/// How long a row must have been expired before a purge may delete it:
/// the database clock may step back by less than this without a purged
/// name's next token falling below its last (the Redis driver keeps its
/// counter as long).
pub const MIN_PURGE_AGE: Duration = Duration::from_secs(60 * 60);

/// The background purge task of [`MySqlBackend::spawn_purger`]; dropping
/// it stops the task.
#[derive(Debug)]
pub struct Purger(tokio::task::AbortHandle);

impl Drop for Purger {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl MySqlBackend {
    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`], an hour) ago, and returns how many it
    /// deleted. Safe at any time: a held or recently released lock is
    /// never touched, and fencing tokens do not depend on the row, so a
    /// name acquired again after its row was purged still gets a greater
    /// token, unless the database clock steps back by more than
    /// `older_than`. Call it in a loop while it returns
    /// `limit`, or let [`MySqlBackend::spawn_purger`] do it. Two
    /// statements (the names, then one `DELETE` by primary key), within
    /// the request timeout.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_duration("older_than", older_than, MIN_PURGE_AGE, MAX_SETTING * 365)?;
        let age = micros_up(older_than);
        let query = sqlx::query_scalar(self.inner.sql.purge_candidates.clone())
            .bind(age)
            .bind(limit);
        let (by, limit_time) = (self.deadline(), self.inner.request_timeout);
        let mut lent = self.lend("purge", by).await?;
        let done = timeout_at(by, query.fetch_all(lent.conn())).await;
        let names: Vec<Vec<u8>> = settle(lent, done, limit_time, "purge")?;
        if names.is_empty() {
            return Ok(0);
        }
        let delete = sqlx::raw_sql(self.inner.sql.purge(&names, age));
        Ok(self.execute(delete, "purge", by).await?.rows_affected())
    }

    /// Starts a background task that purges rows expired for longer than
    /// `older_than`, every `every` (jittered), in batches of 1,000. It runs
    /// until the returned handle is dropped; failures are logged and tried
    /// again at the next round. Needs a tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `every` is under a second.
    pub fn spawn_purger(&self, every: Duration, older_than: Duration) -> Result<Purger> {
        if every < Duration::from_secs(1) {
            return Err(Error::invalid_option(
                "every",
                format!("must be at least 1s, got {every:?}"),
            ));
        }
        let backend = self.clone();
        let task = tokio::spawn(async move {
            loop {
                sleep(dlock_core::driver::wait::jitter(every)).await;
                loop {
                    match backend.purge_expired(older_than, 1000).await {
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
}
