//! Deleting rows whose lease ended long ago, on demand or in the
//! background: each name keeps its row after release, so a table of
//! per-entity names grows.

use std::time::Duration;

use dlock_core::Result;
use dlock_core::driver::micros_up;
use dlock_sql::check_purge_age;

use crate::backend::PgBackend;

impl PgBackend {
    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`](crate::MIN_PURGE_AGE), an hour) ago, and returns how many it
    /// deleted, in one statement, within the request timeout. Safe at any
    /// time: a held or recently released lock is never touched (rows
    /// another transaction has locked are skipped), and fencing tokens do
    /// not depend on the row, so a name acquired again after its row was
    /// purged still gets a greater token, unless the database clock steps
    /// back by more than `older_than`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`](dlock_core::Error::InvalidOption) for an `older_than` under an hour; the
    /// driver's errors.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_purge_age(older_than)?;
        let sql = self.inner.sql.purge(micros_up(older_than), limit);
        Ok(self
            .execute(sql, "purge", self.deadline())
            .await?
            .rows_affected())
    }
}
