//! Reader-writer locks and semaphores: the calls of the shared kinds of
//! lock, on the statements of `sql/shared.rs`.

use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::{Attempt, Backoff, Deadline, on_arrival};
use dlock_core::{Error, Lease, LockInfo, LockOptions, Mode, OwnerToken, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::{Instant, timeout_at};

use crate::acquire::token;
use crate::backend::{NAME, PgBackend};
use crate::error::timed_out;
use crate::sql::SharedRenewal;

/// The row of a statement's last part (the parts before it lock a row and
/// return rows of no columns).
fn last(rows: &[PgRow]) -> Option<&PgRow> {
    rows.iter().rev().find(|row| !row.is_empty())
}

/// The count a statement's last part returns.
fn count(rows: &[PgRow], doing: &str) -> Result<i64> {
    let row = last(rows).ok_or_else(|| Error::malformed(NAME, doing, "no row"))?;
    row.try_get(0).map_err(|e| Error::backend(NAME, doing, e))
}

impl PgBackend {
    /// Wakes this process's waiters that a statement's answer names (its
    /// second column: tokens, comma-separated).
    pub(crate) fn wake_shared(&self, rows: &[PgRow]) {
        let who: Option<String> = last(rows).and_then(|row| row.try_get(1).ok()).flatten();
        for waiter in who.iter().flat_map(|w| w.split(',')) {
            self.inner.queued_wakeups.wake(waiter);
        }
    }

    /// How long a queued waiter keeps its place without asking again: a
    /// few of its longest sleeps, plus the round trips of its asking.
    pub(crate) fn place(&self) -> Duration {
        self.inner.max_poll * 3 + self.inner.request_timeout * 2
    }

    /// One acquire of a shared kind, queued as `waiter` (`""`: not queued).
    pub(crate) async fn attempt_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let mode = opts.mode_value();
        let owner = OwnerToken::random()?;
        let sql = self.inner.sql.acquire_shared(
            name.as_bytes(),
            &owner.to_string(),
            mode,
            micros_up(opts.ttl_value()),
            opts.holder_value(),
            waiter,
            micros_up(self.place()),
        );
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("acquire", by).await?;
        // As for the mutex (see `acquire.rs`): counted from when the
        // statement goes, and armed while the outcome is unknown.
        let sent = Instant::now();
        let mut undo = {
            let (backend, lease) = (self.clone(), Lease::with_ttl(name, owner, 0, opts, sent));
            let waiter = waiter.to_owned();
            UndoOnDrop::new(async move { backend.undo_shared(&lease, sent, &waiter).await })
        };
        let done = timeout_at(by, sqlx::raw_sql(sql).fetch_all(lent.conn())).await;
        if matches!(&done, Ok(Ok(_)))
            || matches!(&done, Ok(Err(e)) if e.as_database_error().is_some())
        {
            undo.disarm();
        }
        let rows = self.inner.pool.settle(lent, done, "acquire")?;
        let row = last(&rows).ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let read = |e| Error::backend(NAME, "acquire", e);
        let fence: Option<i64> = row.try_get(0).map_err(read)?;
        let conflict: Option<String> = row.try_get(1).map_err(read)?;
        let left: Option<i64> = row.try_get(2).map_err(read)?;
        if let Some(fence) = fence {
            let lease = Lease::with_ttl(name, owner, token(fence)?, opts, sent);
            return Ok(on_arrival(self, lease));
        }
        if let Some(kind) = conflict {
            return Err(Error::ModeConflict {
                name: name.to_owned(),
                held: Mode::of_marker(&kind),
                asked: mode,
            });
        }
        let left = left.and_then(|us| u64::try_from(us).ok());
        Ok(Attempt::Held {
            expires_in: left.map(Duration::from_micros),
        })
    }

    /// Acquire's wait for a shared kind: a place in the name's queue, given
    /// up however the wait ends without a grant.
    pub(crate) async fn wait_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
        backoff: Backoff,
    ) -> Result<Lease> {
        if let Attempt::Acquired(lease) = self.attempt_shared(name, opts, "").await? {
            return Ok(lease);
        }
        let queued = |waiter: String| async move { self.attempt_shared(name, opts, &waiter).await };
        let leave = |backend: PgBackend, name: String, waiter: String| async move {
            backend.abandon(&name, &waiter).await;
        };
        self.wait_in_queue(name, deadline, backoff, queued, leave)
            .await
    }

    /// Gives a waiter's place up.
    async fn abandon(&self, name: &str, waiter: &str) {
        let notify = self.inner.listen.is_some();
        let left = retry_for(self.inner.request_timeout * 2, || async {
            let sql = self.inner.sql.abandon(name.as_bytes(), waiter, notify);
            self.fetch(sql, "leave the queue", self.deadline()).await
        })
        .await;
        if let Some(rows) = &left {
            self.wake_shared(rows);
        }
        tracing::debug!(name, left = left.is_some(), "left the queue");
    }

    /// Ends a shared hold.
    pub(crate) async fn release_shared(&self, lease: &Lease) -> Result<()> {
        self.end_shared(lease, "").await
    }

    /// Ends a shared hold, giving the place it was granted from back to
    /// `waiter` (`""`: to nobody) if it is that waiter's (see
    /// [`Statements::release_shared`](crate::sql::Statements::release_shared)).
    async fn end_shared(&self, lease: &Lease, waiter: &str) -> Result<()> {
        let notify = self.inner.listen.is_some();
        let owner = lease.owner().to_string();
        let sql = self.inner.sql.release_shared(
            lease.name().as_bytes(),
            &owner,
            waiter,
            micros_up(self.place()),
            notify,
        );
        let rows = self.fetch(sql, "release", self.deadline()).await?;
        if count(&rows, "release")? != 1 {
            return Err(Error::not_held(lease.name()));
        }
        self.wake_shared(&rows);
        Ok(())
    }

    /// Undoes a shared acquire of unknown outcome, sent at `sent` (see
    /// [`PgBackend::undo`]) by `waiter` (`""`: not queued), which gets
    /// its place in the queue back if the acquire was granted from it: a
    /// waiter that lost its place to a grant it never heard of would queue
    /// anew behind later writers, and readers let in beside it would hold
    /// those writers off while it waits behind them.
    async fn undo_shared(&self, lease: &Lease, sent: Instant, waiter: &str) {
        let settled_by = sent + self.inner.request_timeout * 2;
        let ttl = lease.ttl().unwrap_or_default();
        let released = retry_for(ttl, || async {
            match self.end_shared(lease, waiter).await {
                Err(Error::NotHeld { .. }) if Instant::now() < settled_by => Err(timed_out(
                    "undo an acquire: nothing to release yet; it may still commit".to_owned(),
                )),
                Err(Error::NotHeld { .. }) => Ok(false),
                other => other.map(|()| true),
            }
        })
        .await;
        if released == Some(true) && !waiter.is_empty() {
            // Its place is back: the waiter may be first now, and the
            // release announced the queue as it was before.
            self.inner.queued_wakeups.wake(waiter);
        }
        tracing::debug!(
            name = lease.name(),
            ?released,
            "undid an acquire of unknown outcome"
        );
    }

    /// `release_after` of a shared hold.
    pub(crate) async fn hold_shared(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let (owner, hold_owner) = (lease.owner().to_string(), lease.owner().for_hold());
        let sql = self.inner.sql.hold_shared(
            lease.name().as_bytes(),
            &owner,
            &hold_owner.to_string(),
            micros_up(hold).max(1),
        );
        let rows = self.fetch(sql, "release_after", self.deadline()).await?;
        if count(&rows, "release_after")? != 1 {
            return Err(Error::not_held(lease.name()));
        }
        Ok(())
    }

    /// [`Backend::downgrade`](dlock_core::Backend::downgrade).
    pub(crate) async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let not_held = || Error::not_held(write.name());
        if write.mode() != Mode::Write {
            return Err(not_held());
        }
        let reader = OwnerToken::random()?;
        let sent = Instant::now();
        let sql = self.inner.sql.downgrade(
            write.name().as_bytes(),
            &write.owner().to_string(),
            &reader.to_string(),
            micros_up(opts.ttl_value()),
            opts.holder_value(),
        );
        // A read hold of unknown outcome is released, as an acquire's is.
        let mut undo = {
            let (backend, lease) = (
                self.clone(),
                Lease::with_ttl(write.name(), reader, 0, opts, sent),
            );
            UndoOnDrop::new(async move { backend.undo_shared(&lease, sent, "").await })
        };
        let rows = self.fetch(sql, "downgrade", self.deadline()).await;
        if let Err(e) = &rows
            && !e.is_retryable()
        {
            undo.disarm();
        }
        let rows = rows?;
        undo.disarm();
        let fence: i64 = last(&rows)
            .ok_or_else(not_held)?
            .try_get(0)
            .map_err(|e| Error::backend(NAME, "downgrade", e))?;
        Ok(Lease::with_ttl(
            write.name(),
            reader,
            token(fence)?,
            opts,
            sent,
        ))
    }

    /// Extends shared leases in one statement; says which ones it did.
    pub(crate) async fn extend_shared(&self, leases: &mut [&mut Lease]) -> Result<Vec<bool>> {
        let owners: Vec<String> = leases.iter().map(|l| l.owner().to_string()).collect();
        let markers: Vec<String> = leases.iter().map(|l| l.mode().marker()).collect();
        let batch: Vec<SharedRenewal<'_>> = leases
            .iter()
            .zip(&owners)
            .zip(&markers)
            .map(|((lease, owner), marker)| SharedRenewal {
                name: lease.name().as_bytes(),
                owner,
                ttl_us: micros_up(lease.ttl().unwrap_or_default()),
                marker,
            })
            .collect();
        let sql = self.inner.sql.extend_shared(&batch);
        let sent = Instant::now();
        let rows = self.fetch(sql, "extend", self.deadline()).await?;
        let extended = crate::extend::extended_rows(rows.iter().filter(|r| !r.is_empty()))?;
        Ok(leases
            .iter_mut()
            .zip(owners)
            .map(|(lease, owner)| {
                let ours = extended.contains(&(lease.name().as_bytes().to_vec(), owner));
                if ours {
                    lease.extended(sent);
                }
                ours
            })
            .collect())
    }

    /// `force_release` of every kind: a mutex's holder by its token, a
    /// shared kind's holds all at once.
    pub(crate) async fn force_release_any(&self, name: &str) -> Result<Option<LockInfo>> {
        dlock_core::driver::admin::force_release_with(
            NAME,
            name,
            || self.inspect_lock(name),
            || async {
                let notify = self.inner.listen.is_some();
                let sql = self.inner.sql.clear_shared(name.as_bytes(), notify);
                let rows = self.fetch(sql, "force_release", self.deadline()).await?;
                let cleared = count(&rows, "force_release")? > 0;
                if cleared {
                    self.inner.wakeups.wake(name);
                    self.wake_shared(&rows);
                }
                Ok(cleared)
            },
            |lease| async move { self.release_lease(&lease).await },
        )
        .await
    }
}
