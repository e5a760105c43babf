//! Reading who holds what: a page of held locks, or one lock's holder.

use std::time::Duration;

use dlock_core::{Error, HeldLock, LockInfo, LockPage, Mode, Result};
use tokio::time::timeout_at;

use crate::backend::{MySqlBackend, NAME};

/// A row `list` reads: name, owner, holder description, kind, version, µs
/// left.
type ListedRow = (Vec<u8>, String, Option<Vec<u8>>, Option<Vec<u8>>, u64, i64);

/// The row `inspect` reads: a listed row without the name.
type InspectedRow = (String, Option<Vec<u8>>, Option<Vec<u8>>, u64, i64);

impl MySqlBackend {
    /// [`Backend::list`](dlock_core::Backend::list).
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let limit = limit.clamp(1, 10_000);
        let mut pattern = Vec::with_capacity(prefix.len() + 1);
        for &b in prefix.as_bytes() {
            if matches!(b, b'!' | b'%' | b'_') {
                pattern.push(b'!');
            }
            pattern.push(b);
        }
        pattern.push(b'%');
        let query = sqlx::query_as(self.inner.sql.list.clone())
            .bind(cursor.unwrap_or_default().as_bytes())
            .bind(pattern)
            .bind(u32::try_from(limit).unwrap_or(u32::MAX));
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("list", by).await?;
        let done = timeout_at(by, query.fetch_all(lent.conn())).await;
        let rows: Vec<ListedRow> = self.inner.pool.settle(lent, done, "list")?;
        // The next page starts after the last row read, kept or not.
        let next = (rows.len() == limit)
            .then(|| {
                rows.last()
                    .map(|(name, ..)| String::from_utf8_lossy(name).into_owned())
            })
            .flatten();
        let mut locks = Vec::with_capacity(rows.len());
        for (name, owner, holder, kind, version, left) in rows {
            let (Ok(name), Ok(owner)) = (String::from_utf8(name), owner.parse()) else {
                continue; // not a row this driver wrote
            };
            let expires_in = Some(Duration::from_micros(left.unsigned_abs()));
            let mut info = LockInfo::new(owner, version, expires_in).with_holder(text(holder));
            info.mode = mode(kind);
            locks.push(HeldLock::new(name, info));
        }
        Ok(LockPage::new(locks, next))
    }

    /// [`Backend::inspect`](dlock_core::Backend::inspect), with `name`
    /// checked already.
    pub(crate) async fn inspect_lock(&self, name: &str) -> Result<Option<LockInfo>> {
        let query = sqlx::query_as(self.inner.sql.inspect.clone()).bind(name.as_bytes());
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("inspect", by).await?;
        let done = timeout_at(by, query.fetch_optional(lent.conn())).await;
        let row: Option<InspectedRow> = self.inner.pool.settle(lent, done, "inspect")?;
        let Some((owner, holder, kind, version, left)) = row else {
            return Ok(None);
        };
        // A marker whose holds all ended as this read ran.
        if owner.starts_with('~') {
            return Ok(None);
        }
        info_of((owner, holder, kind, version, left), "inspect").map(Some)
    }
}

impl MySqlBackend {
    /// [`Backend::holders`](dlock_core::Backend::holders), with `name`
    /// checked already.
    pub(crate) async fn holders_of(&self, name: &str) -> Result<Vec<LockInfo>> {
        let query = sqlx::query_as(self.inner.sql.holders.clone())
            .bind(name.as_bytes())
            .bind(name.as_bytes());
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("holders", by).await?;
        let done = timeout_at(by, query.fetch_all(lent.conn())).await;
        let rows: Vec<InspectedRow> = self.inner.pool.settle(lent, done, "holders")?;
        rows.into_iter()
            .map(|row| info_of(row, "holders"))
            .collect()
    }
}

/// The holder a row read by `doing` shows.
fn info_of((owner, holder, kind, token, left): InspectedRow, doing: &str) -> Result<LockInfo> {
    let parsed = owner
        .parse()
        .map_err(|_| Error::malformed(NAME, &format!("{doing} (the row's owner token)"), &owner))?;
    let left = Some(Duration::from_micros(left.unsigned_abs()));
    let mut info = LockInfo::new(parsed, token, left).with_holder(text(holder));
    info.mode = mode(kind);
    Ok(info)
}

/// A holder description as stored: bytes (a `VARCHAR` in tables of older
/// releases, in whatever character set they had).
fn text(holder: Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(&holder.unwrap_or_default()).into_owned()
}

/// The kind of hold as stored: the mode code, then the name's marker.
fn mode(kind: Option<Vec<u8>>) -> Option<Mode> {
    let kind = String::from_utf8(kind?).ok()?;
    Mode::of_code(kind.get(..1)?, kind.get(1..)?)
}
