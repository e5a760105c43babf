//! Giving a hold up, keeping it (extend), and a write's downgrade: the
//! statements on a holding session's own connection.

use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use sqlx::Arguments;

use super::PgSessionBackend;
use super::acquire::moved;
use super::conn::{Held, args, query, read};
use super::mark::{fence_of, mark_prefix};
use super::marker::marker;
use super::sql::key;
use crate::backend::NAME;

impl PgSessionBackend {
    /// Gives `lease` up on its session's connection.
    pub(super) async fn release_hold(&self, lease: &Lease) -> Result<()> {
        let session = self.session_of(lease)?;
        let mut slot = session.conn.lock().await;
        let by = self.deadline();
        // The statement's future owns the connection, and a guard ends the
        // session's holds unless it is disarmed: dropped mid-statement, the
        // connection is closed and the holds are lost.
        let Some(mut conn) = slot.take() else {
            return Err(Error::not_held(lease.name()));
        };
        let ends = session.lost.clone().drop_guard();
        let kept = session.other(lease.owner());
        let statement = (
            self.inner.sql.release(lease.mode(), kept.is_some()),
            args(|a| {
                a.add(session.pid)?;
                a.add(key(lease.name()))?;
                if let Some((mark, holder)) = &kept {
                    a.add(mark.as_str())?;
                    a.add(holder.as_str())?;
                }
                a.add(marker(lease.mode()))
            })?,
        );
        let done = query(&mut conn.conn, statement, by, "release").await;
        self.sessions().remove(&lease.owner());
        let held = match &done {
            Ok(rows) => rows.first().map(|r| read::<Option<bool>>(r, 0)).transpose(),
            Err(_) => Ok(None),
        };
        match (done, held) {
            (Ok(_), Ok(Some(Some(true)))) => {
                drop(ends.disarm());
                if let Some((_, holder)) = kept {
                    conn.holder = Some(holder);
                }
                if session.forget(lease.owner()) {
                    self.give_back(conn);
                } else {
                    *slot = Some(conn);
                }
                Ok(())
            }
            // A session the server ended (an operator's `force_release`)
            // held nothing more; one that answered "not held" had lost it.
            (Err(f), _) if !f.ended => Err(f.error),
            (Ok(_), Ok(Some(None))) => {
                // The session that holds may serve other clients now:
                // ended, it frees what it holds.
                self.end_session(session.pid).await;
                Err(moved())
            }
            (Ok(_), Err(e)) => Err(e),
            _ => Err(Error::not_held(lease.name())),
        }
    }

    /// Extends a session lease: nothing to send while its session lives.
    pub(super) async fn keep(&self, lease: &Lease) -> Result<()> {
        self.session_of(lease).map(|_| ())
    }

    /// A read hold beside the write `write`, on its session.
    pub(super) async fn downgrade_hold(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if write.mode() != Mode::Write {
            return Err(Error::not_held(write.name()));
        }
        let session = self.session_of(write)?;
        let owner = OwnerToken::random()?;
        let (write_mark, write_holder) = session
            .hold_of(write.owner())
            .ok_or_else(|| Error::not_held(write.name()))?;
        let mut slot = session.conn.lock().await;
        let by = self.deadline();
        let Some(mut conn) = slot.take() else {
            return Err(Error::not_held(write.name()));
        };
        let ends = session.lost.clone().drop_guard();
        // The session's own write lock puts its read request ahead of any
        // queued writer: granted at once.
        let holder = opts.get_holder().to_owned();
        let args = args(|a| {
            a.add(session.pid)?;
            a.add(key(write.name()))?;
            a.add(mark_prefix(Mode::Read, owner))?;
            a.add(self.ms().to_string())?;
            a.add(holder.as_str())?;
            a.add(format!("{write_mark} {write_holder}"))
        })?;
        let rows = query(
            &mut conn.conn,
            (self.inner.sql.downgrade(), args),
            by,
            "downgrade",
        )
        .await?;
        let mark = Self::answer(&rows, write.name(), Mode::Read)?
            .ok_or_else(|| Error::malformed(NAME, "downgrade", "a wait refused"))?;
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "downgrade", &mark))?;
        let name = write.name().to_owned();
        session.add(Held {
            owner,
            name,
            mode: Mode::Read,
            mark,
            holder,
        });
        self.sessions().insert(owner, session.clone());
        *slot = Some(conn);
        drop(ends.disarm());
        Ok(
            Lease::with_session(write.name(), owner, fence, session.lost.clone())
                .with_mode(Mode::Read)
                .with_holder(opts.get_holder()),
        )
    }
}
