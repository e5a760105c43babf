//! One attempt at a grant, and what its answer makes: a lease on a
//! session of its own, or a refusal (a conflict of kinds).

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use sqlx::Arguments;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use super::PgSessionBackend;
use super::conn::{Conn, Failure, Held, Session, args, query, read};
use super::mark::{fence_of, kind_of, mark_prefix};
use super::marker::marker;
use super::sql::key;
use crate::backend::NAME;

impl PgSessionBackend {
    /// The error for a refused attempt: a conflict of kinds when a holder
    /// is another kind of lock, else `None` (held).
    pub(super) fn refused(name: &str, asked: Mode, letters: &str) -> Result<()> {
        let mutex = asked == Mode::Exclusive;
        let other = letters
            .chars()
            .filter_map(kind_of)
            .find(|held| (*held == Mode::Exclusive) != mutex);
        match other {
            Some(held) => Err(Error::ModeConflict {
                name: name.to_owned(),
                held,
                asked,
            }),
            None => Ok(()),
        }
    }

    /// A grant's statement and its arguments (see [`SessionSql::new`]);
    /// `wait_ms` for a wait.
    pub(super) fn grant(
        &self,
        (name, opts): (&str, &LockOptions),
        (conn, owner): (&Conn, OwnerToken),
        wait_ms: Option<i64>,
    ) -> Result<(sqlx::SqlStr, sqlx::postgres::PgArguments)> {
        let (mode, holder) = (opts.get_mode(), opts.get_holder());
        // The row names the hold for `list`: written when it names another.
        let write = conn.holder.as_deref() != Some(holder) || conn.name.as_deref() != Some(name);
        let args = args(|a| {
            a.add(conn.pid)?;
            a.add(key(name))?;
            a.add(mark_prefix(mode, owner))?;
            // A try's key never waits; its marker may, for a look.
            a.add(wait_ms.unwrap_or_else(|| self.ms()).to_string())?;
            a.add(marker(mode))?;
            if write {
                a.add(holder)?;
                a.add(name.as_bytes())
            } else {
                Ok(())
            }
        })?;
        Ok((self.inner.sql.grant(mode, wait_ms.is_some(), write), args))
    }

    /// A grant's answer for `name` asked as `asked`: the mark, `None`
    /// when refused.
    ///
    /// # Errors
    /// [`Error::ModeConflict`] when the holders are another kind of lock.
    pub(super) fn answer(rows: &[PgRow], name: &str, asked: Mode) -> Result<Option<String>> {
        let row = rows
            .first()
            .ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        match read::<Option<String>>(row, 0)? {
            Some(refused) if refused.is_empty() => Ok(None),
            Some(conflict) if conflict.starts_with('!') => {
                Self::refused(name, asked, &conflict[1..])?;
                Err(Error::malformed(NAME, "acquire", &conflict))
            }
            Some(mark) => Ok(Some(mark)),
            None => Err(moved()),
        }
    }

    /// A granted hold on `conn`: its lease, its session watched.
    pub(super) fn granted(
        &self,
        (name, opts): (&str, &LockOptions),
        owner: OwnerToken,
        mut conn: Conn,
        mark: String,
    ) -> Result<Lease> {
        let (mode, holder) = (opts.get_mode(), opts.get_holder().to_owned());
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "acquire", &mark))?;
        conn.holder = Some(holder.clone());
        conn.name = Some(name.to_owned());
        let hold = Held {
            holder,
            owner,
            name: name.to_owned(),
            mode,
            mark,
        };
        let session = Session::new(conn, hold);
        self.sessions().insert(owner, session.clone());
        Ok(
            Lease::with_session(name, owner, fence, session.lost.clone())
                .with_mode(mode)
                .with_holder(opts.get_holder()),
        )
    }

    /// One attempt: the lease, or the connection that was refused.
    pub(super) async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<std::result::Result<Lease, Conn>> {
        let owner = OwnerToken::random()?;
        let by = self.deadline();
        let mut conn = self.connection("acquire", by, Some(name)).await?;
        let rows = self
            .grant_on(&mut conn, (name, opts), owner, None, by)
            .await??;
        if let Some(mark) = Self::answer(&rows, name, opts.get_mode())? {
            return self.granted((name, opts), owner, conn, mark).map(Ok);
        }
        // Refused: by another kind of lock of the name?
        let mode = opts.get_mode();
        let kinds = args(|a| {
            a.add(conn.pid)?;
            a.add(key(name))?;
            a.add(marker(mode))
        })?;
        let rows = query(
            &mut conn.conn,
            (self.inner.sql.kinds(), kinds),
            by,
            "acquire",
        )
        .await?;
        let letters: Option<String> = rows.first().map(|r| read(r, 0)).transpose()?.flatten();
        if let Err(conflict) = Self::refused(name, mode, letters.as_deref().unwrap_or_default()) {
            // It holds nothing: fit for the next.
            self.give_back(conn);
            return Err(conflict);
        }
        Ok(Err(conn))
    }

    /// Runs a grant of `owner` on `conn`, by `by` (see
    /// [`Self::unanswered_undone`]). A connection that sat idle may be dead
    /// (a server restart): when it fails before `by` without an answer,
    /// the grant is tried once more on a new one. Closed, the dead one
    /// holds nothing. A grant that ran out of time is not tried again: the
    /// new one would have none.
    pub(super) async fn grant_on(
        &self,
        conn: &mut Conn,
        (name, opts): (&str, &LockOptions),
        owner: OwnerToken,
        wait_ms: Option<i64>,
        by: Instant,
    ) -> Result<std::result::Result<Vec<PgRow>, Failure>> {
        let reused = conn.reused;
        let grant = self.grant((name, opts), (conn, owner), wait_ms)?;
        Ok(
            match self.unanswered_undone(conn, grant, by, key(name)).await {
                Err(f) if reused && f.code.is_none() && !f.ended && Instant::now() < by => {
                    tracing::debug!(error = %f.error, "an idle connection failed; trying a new one");
                    *conn = self
                        .new_connection("acquire", by.min(self.deadline()))
                        .await?;
                    let grant = self.grant((name, opts), (conn, owner), wait_ms)?;
                    self.unanswered_undone(conn, grant, by, key(name)).await
                }
                done => done,
            },
        )
    }

    /// Runs a grant on `conn`. Unanswered (its reply lost, or its future
    /// dropped), its server session is ended from another connection:
    /// closing this one frees what it took only once the server sees it
    /// closed, which a black-holed link delays until the session's
    /// silence ends it.
    pub(super) async fn unanswered_undone(
        &self,
        conn: &mut Conn,
        grant: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        by: Instant,
        key: i64,
    ) -> std::result::Result<Vec<PgRow>, Failure> {
        let mut undo = {
            let (backend, pid) = (self.clone(), conn.pid);
            UndoOnDrop::new(async move { backend.end_wait(pid, key).await })
        };
        let done = query(&mut conn.conn, grant, by, "acquire").await;
        if !matches!(&done, Err(f) if f.code.is_none() && !f.ended) {
            undo.disarm();
        }
        done
    }
}

/// A statement answered by another server session than the one asked.
pub(super) fn moved() -> Error {
    Error::invalid_option(
        "mode",
        "a statement reached another server session than its connection's: the session mode \
         needs connections that keep their session (not a pooler in transaction mode)",
    )
}
