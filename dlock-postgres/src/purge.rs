//! Deleting rows whose lease ended long ago, on demand or in the
//! background: each name keeps its row after release, so a table of
//! per-entity names grows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::{Error, Result};
use dlock_sql::check_purge_age;
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use crate::backend::{NAME, PgBackend};

/// Pages a purge reads at once (32 MB of 8 KB pages).
pub(crate) const SLICE: u64 = 4096;

/// Slices of each table one purge reads at most.
const SLICES: u32 = 8;

/// No page yet: a backend's first purge of a table starts at a page drawn
/// at random, so that short-lived processes, each purging once, do not all
/// read only the first slices.
const UNSET: u64 = u64::MAX;

/// Where the next purge of each table (the lock table, its holds table)
/// reads from: a purge goes on where the last one stopped, and starts over
/// past the table's end.
#[derive(Debug)]
pub(crate) struct Cursor {
    next: [AtomicU64; 2],
    /// Pages a slice has.
    pub(crate) slice: AtomicU64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor {
            next: [AtomicU64::new(UNSET), AtomicU64::new(UNSET)],
            slice: AtomicU64::new(SLICE),
        }
    }
}

impl PgBackend {
    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`](crate::MIN_PURGE_AGE), an hour) ago, and
    /// up to as many ended holds and queue places of reader-writer locks
    /// and semaphores, and returns how many it deleted. No index leads to
    /// expired rows (renewals then update rows in place): each table is
    /// read a slice of 32 MB at a time, from where the last purge of this
    /// backend stopped (a backend's first, from a page drawn at random),
    /// eight slices at most, and no slice is begun after half the request
    /// timeout: a call is bounded work however large the table, and
    /// returns within the request timeout. Calls in turn read the whole
    /// table ([`spawn_purger`](Self::spawn_purger) goes on while they come
    /// back full). Safe at any time: a held or recently released lock is
    /// never touched (rows another transaction has locked are skipped, and
    /// the expiry is judged again once locked), and fencing tokens do not
    /// depend on the row, so a name acquired again after its row was purged
    /// still gets a greater token, unless the database clock steps back by
    /// more than `older_than`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an `older_than` under an hour; the
    /// driver's errors.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_purge_age(older_than)?;
        let (age, cursor) = (micros_up(older_than), &self.inner.purge);
        let slice = cursor.slice.load(Ordering::Relaxed);
        let by = self.deadline();
        let late = Instant::now() + self.inner.request_timeout / 2;
        let mut deleted = 0;
        for (holds, next) in [false, true].into_iter().zip(&cursor.next) {
            let mut left = limit;
            for _ in 0..SLICES {
                if left == 0 || Instant::now() >= late {
                    break;
                }
                let mut first = next.load(Ordering::Relaxed);
                if first == UNSET {
                    let rows = self.fetch(self.inner.sql.pages(holds), "purge", by).await?;
                    first = fastrand::u64(0..number(&rows, 0)?.max(1));
                }
                let sql = self.inner.sql.purge(holds, age, left, (first, slice));
                let rows = self.fetch(sql, "purge", by).await?;
                let (gone, pages) = (number(&rows, 0)?, number(&rows, 1)?);
                deleted += gone;
                left = left.saturating_sub(u32::try_from(gone).unwrap_or(u32::MAX));
                // A slice cut short by the limit is read again next time.
                let after = if left == 0 { first } else { first + slice };
                next.store(if after >= pages { 0 } else { after }, Ordering::Relaxed);
            }
        }
        Ok(deleted)
    }
}

/// Column `i` of the last row, a count.
fn number(rows: &[PgRow], i: usize) -> Result<u64> {
    let value: i64 = rows
        .last()
        .ok_or_else(|| Error::malformed(NAME, "purge", "no row"))?
        .try_get(i)
        .map_err(|e| Error::backend(NAME, "purge", e))?;
    Ok(value.unsigned_abs())
}
