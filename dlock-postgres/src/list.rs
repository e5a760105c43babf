//! Reading who holds what: a page of held locks, or one lock's holder.

use std::time::Duration;

use dlock_core::{Error, HeldLock, LockInfo, LockPage, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::backend::{NAME, PgBackend};

impl PgBackend {
    /// [`Backend::list`](dlock_core::Backend::list).
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let limit = limit.clamp(1, 10_000);
        let cursor = cursor.unwrap_or_default();
        let sql = self
            .inner
            .sql
            .list(prefix.as_bytes(), cursor.as_bytes(), limit);
        let rows = self.fetch(sql, "list", self.deadline()).await?;
        // The next page starts after the last row read, kept or not.
        let next = (rows.len() == limit)
            .then(|| {
                rows.last()
                    .and_then(|row| row.try_get::<Vec<u8>, _>(0).ok())
            })
            .flatten()
            .map(|name| String::from_utf8_lossy(&name).into_owned());
        let mut locks = Vec::with_capacity(rows.len());
        for row in &rows {
            let Ok(name) = row.try_get::<Vec<u8>, _>(0) else {
                continue;
            };
            let (Ok(name), Some(info)) = (String::from_utf8(name), holder(row, 1).ok()) else {
                continue; // not a row this driver wrote
            };
            locks.push(HeldLock::new(name, info));
        }
        Ok(LockPage::new(locks, next))
    }

    /// [`Backend::inspect`](dlock_core::Backend::inspect), with `name`
    /// checked already.
    pub(crate) async fn inspect_lock(&self, name: &str) -> Result<Option<LockInfo>> {
        let sql = self.inner.sql.inspect(name.as_bytes());
        let rows = self.fetch(sql, "inspect", self.deadline()).await?;
        rows.first().map(|row| holder(row, 0)).transpose()
    }
}

/// The holder in `row`'s columns from `at`: owner, fence, microseconds left.
fn holder(row: &PgRow, at: usize) -> Result<LockInfo> {
    let read = |e| Error::backend(NAME, "inspect", e);
    let owner: String = row.try_get(at).map_err(read)?;
    let fence: i64 = row.try_get(at + 1).map_err(read)?;
    let left: i64 = row.try_get(at + 2).map_err(read)?;
    let owner = owner
        .parse()
        .map_err(|_| Error::malformed(NAME, "inspect (the row's owner token)", &owner))?;
    let fence =
        u64::try_from(fence).map_err(|_| Error::malformed(NAME, "inspect (the fence)", fence))?;
    Ok(LockInfo::new(
        owner,
        fence,
        Some(Duration::from_micros(left.unsigned_abs())),
    ))
}
