//! Reading who holds what: a page of held locks, or one lock's holder.

use std::time::Duration;

use dlock_core::{Error, HeldLock, LockInfo, LockPage, Mode, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::backend::{NAME, PgBackend};
use crate::sql::unhex;

/// Where a page of `list` starts (the name of a cursor this driver gave:
/// its bytes in hex; empty for the first page), and its most rows.
pub(crate) fn page(cursor: Option<&str>, limit: usize) -> Result<(Vec<u8>, usize)> {
    let after = match cursor {
        None => Vec::new(),
        Some(c) => unhex(c)
            .ok_or_else(|| Error::invalid_option("cursor", "not a cursor this driver gave"))?,
    };
    Ok((after, limit.clamp(1, 10_000)))
}

impl PgBackend {
    /// [`Backend::list`](dlock_core::Backend::list): a page of rows of the
    /// prefix's key range, the held ones kept (a page may hold fewer than
    /// `limit` locks; the next one starts after the last row read).
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let (cursor, limit) = page(cursor, limit)?;
        let sql = self.inner.sql.list(prefix.as_bytes(), &cursor, limit);
        let rows = self.fetch(sql, "list", self.deadline()).await?;
        let read = |e| Error::backend(NAME, "list", e);
        let mut locks = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let hex: String = row.try_get(0).map_err(read)?;
            let live: bool = row.try_get(6).map_err(read)?;
            let name = unhex(&hex).ok_or_else(|| Error::malformed(NAME, "list", &hex))?;
            last = Some(hex);
            let Ok(name) = String::from_utf8(name) else {
                continue; // not a row this driver wrote
            };
            if live && let Some(info) = holder(row, 1)? {
                locks.push(HeldLock::new(name, info));
            }
        }
        let next = if rows.len() == limit { last } else { None };
        Ok(LockPage::new(locks, next))
    }

    /// [`Backend::inspect`](dlock_core::Backend::inspect), with `name`
    /// checked already.
    pub(crate) async fn inspect_lock(&self, name: &str) -> Result<Option<LockInfo>> {
        let sql = self.inner.sql.inspect(name.as_bytes());
        let rows = self.fetch(sql, "inspect", self.deadline()).await?;
        Ok(match rows.first() {
            Some(row) => holder(row, 0)?,
            None => None,
        })
    }

    /// [`Backend::holders`](dlock_core::Backend::holders), with `name`
    /// checked already.
    pub(crate) async fn holders_of(&self, name: &str) -> Result<Vec<LockInfo>> {
        let sql = self.inner.sql.holders(name.as_bytes());
        let rows = self.fetch(sql, "holders", self.deadline()).await?;
        let mut holds = Vec::with_capacity(rows.len());
        for row in &rows {
            holds.extend(holder(row, 0)?);
        }
        Ok(holds)
    }
}

/// The holder in `row`'s columns from `at`: owner, holder description,
/// kind (mode code and marker), fence, microseconds left; `None` for a reader-writer lock or semaphore
/// with no live hold.
fn holder(row: &PgRow, at: usize) -> Result<Option<LockInfo>> {
    let read = |e| Error::backend(NAME, "inspect", e);
    let owner: Option<String> = row.try_get(at).map_err(read)?;
    let Some(owner) = owner else {
        return Ok(None);
    };
    let holder: Option<String> = row.try_get(at + 1).map_err(read)?;
    let kind: Option<String> = row.try_get(at + 2).map_err(read)?;
    let fence: i64 = row.try_get(at + 3).map_err(read)?;
    let left: i64 = row.try_get(at + 4).map_err(read)?;
    let owner = owner
        .parse()
        .map_err(|_| Error::malformed(NAME, "inspect (the row's owner token)", &owner))?;
    let fence =
        u64::try_from(fence).map_err(|_| Error::malformed(NAME, "inspect (the fence)", fence))?;
    let left = Duration::from_micros(u64::try_from(left).unwrap_or(0));
    let mut info = LockInfo::new(owner, fence, Some(left)).with_holder(holder.unwrap_or_default());
    info.mode = kind.and_then(|k| Mode::of_code(k.get(..1)?, k.get(1..)?));
    Ok(Some(info))
}
