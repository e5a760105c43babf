//! What an operator sees and does: the held names, the holders of a name,
//! and ending them; and the statements run on an idle connection.

use dlock_core::{HeldLock, LockInfo, LockPage, Result};
use sqlx::Arguments;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use super::PgSessionBackend;
use super::conn::{args, query, read};
use super::mark::info;
use super::sql::key;
use crate::list::page;

impl PgSessionBackend {
    /// Ends the sessions that hold `name`.
    pub(super) async fn end_holders(&self, name: &str) -> Result<Option<LockInfo>> {
        // Half the request timeout for the sessions to end, the rest for
        // the answer.
        let args = args(|a| {
            a.add(key(name))?;
            a.add(self.ms() / 2)
        })?;
        // Core gives this call ten request timeouts: the sessions end one
        // after another.
        let by = Instant::now() + self.inner.request_timeout * 9;
        let rows = self
            .statement_by((self.inner.sql.terminate(), args), by, "force_release")
            .await?;
        // This process's own holds among them are lost now, not at their
        // next probe.
        let ended: Vec<i32> = rows.iter().map(|r| read(r, 0)).collect::<Result<_>>()?;
        self.sessions().retain(|_, s| {
            let gone = ended.contains(&s.pid);
            if gone {
                s.lost.cancel();
            }
            !gone
        });
        holders(&rows).map(|all| all.into_iter().next())
    }

    /// The holds of `name`, at most `limit`.
    pub(super) async fn holders_of(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let args = args(|a| {
            a.add(key(name))?;
            a.add(limit)
        })?;
        let rows = self
            .statement((self.inner.sql.holders(), args), "holders")
            .await?;
        holders(&rows)
    }
    /// A page of the held names under `prefix`, after the cursor's.
    pub(super) async fn list_held(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let (after, limit) = page(cursor, limit)?;
        let args = args(|a| {
            a.add(prefix.as_bytes())?;
            a.add(after)?;
            a.add(i64::try_from(limit).unwrap_or(i64::MAX))
        })?;
        let rows = self
            .statement((self.inner.sql.list(), args), "list")
            .await?;
        let mut locks = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let name: Vec<u8> = read(row, 0)?;
            last = Some(hex::encode(&name));
            let Ok(name) = String::from_utf8(name) else {
                continue; // not a row this driver wrote
            };
            if let Some(info) = hold(row, 1)? {
                locks.push(HeldLock::new(name, info));
            }
        }
        let next = if rows.len() == limit { last } else { None };
        Ok(LockPage::new(locks, next))
    }

    /// One statement on an idle connection, given back after.
    pub(super) async fn statement(
        &self,
        statement: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        doing: &str,
    ) -> Result<Vec<PgRow>> {
        self.statement_by(statement, self.deadline(), doing).await
    }

    /// One statement on an idle connection, answered by `by`.
    async fn statement_by(
        &self,
        statement: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        by: Instant,
        doing: &str,
    ) -> Result<Vec<PgRow>> {
        let mut conn = self.connection(doing, by, None).await?;
        let rows = query(&mut conn.conn, statement, by, doing).await?;
        self.give_back(conn);
        Ok(rows)
    }

    /// Ends the server session `pid`, which holds for this process but
    /// serves another client (a pooler moved it).
    pub(super) async fn end_session(&self, pid: i32) {
        let ended = match args(|a| a.add(pid)) {
            Ok(args) => {
                let end = sqlx::SqlStr::from_static("SELECT pg_terminate_backend($1)");
                self.statement((end, args), "release").await.map(drop)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            tracing::warn!(pid, error = %e, "a moved holding session was not ended");
        }
    }

    /// Ends the server session `pid` of a dropped wait for `key`.
    pub(super) async fn end_wait(&self, pid: i32, key: i64) {
        let ended = match args(|a| {
            a.add(pid)?;
            a.add(key)
        }) {
            Ok(args) => self
                .statement((self.inner.sql.undo(), args), "undo")
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            tracing::warn!(pid, error = %e, "a dropped wait's server session was not ended; it ends once the server sees its connection closed");
        }
    }
}

/// The holders `pg_locks` rows show, with their sessions' rows.
fn holders(rows: &[PgRow]) -> Result<Vec<LockInfo>> {
    let mut all = Vec::with_capacity(rows.len());
    for row in rows {
        all.extend(hold(row, 1)?);
    }
    Ok(all)
}

/// The hold in `row`'s columns from `at`: its session's
/// `application_name`, the holder and marks of its row, its lock's mode.
fn hold(row: &PgRow, at: usize) -> Result<Option<LockInfo>> {
    let application_name: Option<String> = read(row, at)?;
    let (holder, marks, mode): (String, String, String) =
        (read(row, at + 1)?, read(row, at + 2)?, read(row, at + 3)?);
    Ok(info(
        application_name.as_deref().unwrap_or_default(),
        &holder,
        &marks,
        &mode,
    ))
}
