//! Deleting rows whose lease ended long ago, on demand or in the
//! background: each name keeps its row after release, so a table of
//! per-entity names grows.

use std::time::Duration;

use dlock_core::Result;
use dlock_core::driver::micros_up;
use dlock_sql::check_purge_age;
use tokio::time::timeout_at;

use crate::backend::MySqlBackend;

impl MySqlBackend {
    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`](crate::MIN_PURGE_AGE), an hour) ago, and returns how many it
    /// deleted. Safe at any time: a held or recently released lock is
    /// never touched, and fencing tokens do not depend on the row, so a
    /// name acquired again after its row was purged still gets a greater
    /// token, unless the database clock steps back by more than
    /// `older_than`. Call it in a loop while it returns
    /// `limit`, or let [`MySqlBackend::spawn_purger`] do it. Two
    /// statements (the names, then one `DELETE` by primary key), within
    /// the request timeout.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_purge_age(older_than)?;
        let age = micros_up(older_than);
        let query = sqlx::query_scalar(self.inner.sql.purge_candidates.clone())
            .bind(age)
            .bind(limit);
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("purge", by).await?;
        let done = timeout_at(by, query.fetch_all(lent.conn())).await;
        let names: Vec<Vec<u8>> = self.inner.pool.settle(lent, done, "purge")?;
        if names.is_empty() {
            return Ok(0);
        }
        let delete = sqlx::raw_sql(self.inner.sql.purge(&names, age));
        Ok(self.execute(delete, "purge", by).await?.rows_affected())
    }
}
