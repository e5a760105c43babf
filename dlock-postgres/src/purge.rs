//! Deleting rows whose lease ended long ago, on demand or in the
//! background: each name keeps its row after release, so a table of
//! per-entity names grows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::{Error, Result};
use dlock_sql::check_purge_age;
use sqlx::Row;

use crate::backend::{NAME, PgBackend};

/// Pages a purge reads at once (32 MB of 8 KB pages).
pub(crate) const SLICE: u64 = 4096;

/// Slices of each table one purge reads at most.
const SLICES: u32 = 8;

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
            next: [AtomicU64::new(0), AtomicU64::new(0)],
            slice: AtomicU64::new(SLICE),
        }
    }
}

impl PgBackend {
    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`](crate::MIN_PURGE_AGE), an hour) ago, and
    /// as many ended holds and queue places of reader-writer locks and
    /// semaphores, and returns how many it deleted. No index leads to
    /// expired rows (renewals then update rows in place): each table is
    /// read a slice of 32 MB at a time, from where the last purge of this
    /// backend stopped, eight slices at most (so a call is bounded work
    /// however large the table; [`spawn_purger`](Self::spawn_purger) goes
    /// on while calls come back full). Each statement is bounded by the
    /// request timeout. Safe at any time: a held or recently released lock
    /// is never touched (rows another transaction has locked are skipped),
    /// and fencing tokens do not depend on the row, so a name acquired
    /// again after its row was purged still gets a greater token, unless
    /// the database clock steps back by more than `older_than`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an `older_than` under an hour; the
    /// driver's errors.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_purge_age(older_than)?;
        let (age, cursor) = (micros_up(older_than), &self.inner.purge);
        let slice = cursor.slice.load(Ordering::Relaxed);
        let mut deleted = 0;
        for (holds, next) in [false, true].into_iter().zip(&cursor.next) {
            for _ in 0..SLICES {
                let Some(left) = u64::from(limit).checked_sub(deleted).filter(|&l| l > 0) else {
                    return Ok(deleted);
                };
                let first = next.load(Ordering::Relaxed);
                let left = u32::try_from(left).unwrap_or(limit);
                let sql = self.inner.sql.purge(holds, age, left, (first, slice));
                let rows = self.fetch(sql, "purge", self.deadline()).await?;
                let read = |i| -> Result<u64> {
                    let value: i64 = rows
                        .last()
                        .ok_or_else(|| Error::malformed(NAME, "purge", "no row"))?
                        .try_get(i)
                        .map_err(|e| Error::backend(NAME, "purge", e))?;
                    Ok(value.unsigned_abs())
                };
                deleted += read(0)?;
                let after = first + slice;
                if after >= read(1)? {
                    next.store(0, Ordering::Relaxed);
                    break;
                }
                next.store(after, Ordering::Relaxed);
            }
        }
        Ok(deleted)
    }
}
