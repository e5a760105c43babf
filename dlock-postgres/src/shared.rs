//! Reader-writer locks and semaphores: the calls of the shared kinds of
//! lock, on the statements of `sql/shared.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::driver::async_trait;
use dlock_core::driver::micros_up;
use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Attempt, Backoff, Deadline};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use dlock_sql::{SharedKinds, SharedStatements};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::{Instant, timeout_at};

use crate::acquire::token;
use crate::backend::{NAME, PgBackend};
use crate::error::timed_out;
use crate::pool::fetch_on;
use crate::sql::{SharedRenewal, Stmt};

/// The row of a statement's last part that answers one (the parts that
/// lock a row return rows of no columns, and a change's own answer comes
/// before its read of whom to wake).
fn last(rows: &[PgRow]) -> Option<&PgRow> {
    rows.iter().rev().find(|row| !row.is_empty())
}

/// The count a change answers, before the read of whom to wake (see
/// `Statements::then_wake`).
fn count(rows: &[PgRow], doing: &str) -> Result<i64> {
    let row = rows
        .iter()
        .find(|row| !row.is_empty())
        .ok_or_else(|| Error::malformed(NAME, doing, "no row"))?;
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

    /// One acquire of a shared kind, queued as `waiter` (`""`: not queued).
    pub(crate) async fn attempt_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sql = self.inner.sql.acquire_shared(
            name.as_bytes(),
            &owner.to_string(),
            opts.get_mode(),
            micros_up(opts.get_ttl()),
            opts.get_holder(),
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
            let waits = sql.waits();
            UndoOnDrop::new(
                async move { backend.undo_shared(&lease, (sent, waits), &waiter).await },
            )
        };
        let done = timeout_at(by, fetch_on(&mut lent, &sql)).await;
        if matches!(&done, Ok(Ok(_)))
            || matches!(&done, Ok(Err(e)) if e.as_database_error().is_some())
        {
            undo.disarm();
        }
        let rows = self.inner.pool.settle(lent, done, "acquire")?;
        let row = last(&rows).ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let read = |e| Error::backend(NAME, "acquire", e);
        let answer = (
            row.try_get(0).map_err(read)?,
            row.try_get(1).map_err(read)?,
            row.try_get(2).map_err(read)?,
        );
        self.shared_outcome(name, opts, (owner, sent), answer)
    }

    /// Queues `waiter` without the name's row lock, and reads whether the
    /// acquire's rule lets it in now (see
    /// [`Statements::enqueue_shared`](crate::sql::Statements)): `None`
    /// when it does, for a look to take the grant, else the attempt's
    /// outcome.
    async fn enqueue_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Option<Attempt>> {
        let place = micros_up(self.place());
        let enqueue =
            self.inner
                .sql
                .enqueue_shared(name.as_bytes(), opts.get_mode(), waiter, place);
        let rows = self.fetch(enqueue, "acquire", self.deadline()).await?;
        let row = last(&rows).ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let read = |e| Error::backend(NAME, "acquire", e);
        if row.try_get::<Option<bool>, _>(1).map_err(read)? == Some(true) {
            return Ok(None);
        }
        // Not let in: the outcome of a refused look (the conflict, or held).
        let (conflict, left) = (row.try_get(0).map_err(read)?, row.try_get(2).map_err(read)?);
        self.refused(name, opts, conflict, left).map(Some)
    }

    /// Acquire's wait for a shared kind: a place in the name's queue from
    /// the first look, given up however the wait ends without a grant. The
    /// first look queues without the name's row lock and reads the rule;
    /// only a waiter the rule lets in (then, or once a change wakes it)
    /// takes the lock to be granted. In a crowd most first looks are
    /// refused, and each would hold up every release of the name.
    pub(crate) async fn wait_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
        backoff: Backoff,
    ) -> Result<Lease> {
        if deadline.is_past() {
            return match self.attempt_shared(name, opts, "").await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Held { .. } => Err(deadline.timeout_error(name)),
            };
        }
        let first = AtomicBool::new(true);
        let queued = |waiter: String| {
            let first = &first;
            async move {
                if first.swap(false, Ordering::Relaxed) {
                    // A failed first look is made again: only it reads the
                    // rule after its place's commit (see `enqueue_shared`).
                    let enqueued = self.enqueue_shared(name, opts, &waiter).await;
                    if enqueued.is_err() {
                        first.store(true, Ordering::Relaxed);
                    }
                    if let Some(refused) = enqueued? {
                        return Ok(refused);
                    }
                }
                self.attempt_shared(name, opts, &waiter).await
            }
        };
        let leave = |backend: PgBackend, name: String, waiter: String| async move {
            backend.abandon(&name, &waiter).await;
        };
        self.wait_in_queue(name, deadline, backoff, queued, leave)
            .await
    }

    /// Gives a waiter's place up.
    async fn abandon(&self, name: &str, waiter: &str) {
        let notify = self.wakes_others();
        let left = self
            .inner
            .pool
            .retry_in_background(self.inner.request_timeout * 2, || async {
                let sql = self.inner.sql.abandon(name.as_bytes(), waiter, notify);
                self.fetch(sql, "leave the queue", self.deadline()).await
            })
            .await;
        if let Some(rows) = &left {
            self.wake_shared(rows);
        }
        tracing::debug!(name, left = left.is_some(), "left the queue");
    }

    /// Undoes a shared acquire of unknown outcome, sent at `sent` in a
    /// query of `waits` statements that may wait (see [`PgBackend::undo`])
    /// by `waiter` (`""`: not queued), which gets
    /// its place in the queue back if the acquire was granted from it: a
    /// waiter that lost its place to a grant it never heard of would queue
    /// anew behind later writers, and readers let in beside it would hold
    /// those writers off while it waits behind them.
    async fn undo_shared(&self, lease: &Lease, (sent, waits): (Instant, u32), waiter: &str) {
        let settled_by = sent + self.inner.request_timeout * (1 + waits);
        let ttl = lease.ttl().unwrap_or_default();
        let released = self
            .inner
            .pool
            .retry_in_background(ttl, || async {
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
            // Its place is back: the waiter may be first now.
            self.inner.queued_wakeups.wake(waiter);
        }
        tracing::debug!(
            name = lease.name(),
            ?released,
            "undid an acquire of unknown outcome"
        );
    }

    /// Extends shared leases in one statement; says which ones it did.
    pub(crate) async fn extend_shared(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
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
}

#[async_trait]
impl SharedKinds for PgBackend {
    type Stmt = Stmt;

    fn statements(&self) -> &dyn SharedStatements<Stmt = Stmt> {
        &self.inner.sql
    }

    fn wakes_others(&self) -> bool {
        self.inner.listen.is_some()
    }

    fn max_poll(&self) -> Duration {
        self.inner.max_poll
    }

    fn token(&self, fence: i64, doing: &str) -> Result<u64> {
        token(fence, doing)
    }

    /// A read or a permit ends without the name's row lock (see
    /// `Statements::release_unlocked` in `sql/wake.rs`): in a
    /// crowd every release took that lock in turn, in the way of every
    /// grant. A write's release, which lets in whoever waits, keeps the
    /// locked change.
    async fn release_shared(&self, lease: &Lease) -> Result<()> {
        if lease.mode() == Mode::Write {
            return self.end_shared(lease, "").await;
        }
        let (name, owner) = (lease.name(), lease.owner().to_string());
        let sql = self
            .inner
            .sql
            .release_unlocked(name.as_bytes(), &owner, self.wakes_others());
        let rows = self.fetch(sql, "release", self.deadline()).await?;
        let answers: Vec<&PgRow> = rows.iter().filter(|row| !row.is_empty()).collect();
        let (Some(ended), Some(after)) = (answers.first(), answers.last()) else {
            return Err(Error::malformed(NAME, "release", "no row"));
        };
        let read = |e| Error::backend(NAME, "release", e);
        let ended: i64 = ended.try_get(0).map_err(read)?;
        let (left, admitted, marked): (i64, Option<String>, bool) = (
            after.try_get(0).map_err(read)?,
            after.try_get(1).map_err(read)?,
            after.try_get(3).map_err(read)?,
        );
        if ended > 0 {
            self.inner.wakeups.wake(name);
        }
        self.wake_shared(&rows);
        if left == 0 && marked && admitted.is_none() {
            // Nothing held and nobody let in: the marker goes down so that
            // the name may be used as another kind at once. Left up, it
            // lapses at its longest hold's end; a failed try goes on in the
            // background, the release being done.
            let settle = || {
                self.execute(
                    self.inner.sql.settle_marker(name.as_bytes()),
                    "release",
                    self.deadline(),
                )
            };
            if let Err(error) = settle().await {
                tracing::debug!(name, %error, "could not lower the marker yet");
                let (backend, name) = (self.clone(), name.to_owned());
                let ttl = lease.ttl().unwrap_or_default();
                tokio::spawn(async move {
                    let settled = backend
                        .inner
                        .pool
                        .retry_in_background(ttl, || async {
                            let sql = backend.inner.sql.settle_marker(name.as_bytes());
                            backend.execute(sql, "release", backend.deadline()).await
                        })
                        .await;
                    tracing::debug!(
                        name,
                        settled = settled.is_some(),
                        "lowered the marker later"
                    );
                });
            }
        }
        if ended != 1 {
            return Err(Error::not_held(name));
        }
        Ok(())
    }

    /// A change's first row holds the count, its last the waiters of this
    /// process to wake.
    async fn change(&self, sql: Stmt, name: &str, doing: &str) -> Result<i64> {
        let rows = self.fetch(sql, doing, self.deadline()).await?;
        let changed = count(&rows, doing)?;
        if changed > 0 {
            self.inner.wakeups.wake(name);
            self.wake_shared(&rows);
        }
        Ok(changed)
    }

    async fn value(&self, sql: Stmt, doing: &str) -> Result<Option<i64>> {
        let rows = self.fetch(sql, doing, self.deadline()).await?;
        let Some(row) = last(&rows) else {
            return Ok(None);
        };
        row.try_get(0).map_err(|e| Error::backend(NAME, doing, e))
    }

    async fn undo_downgrade(&self, lease: Lease, sent: Instant) {
        // The downgrade's statement is a change of a shared kind, as an
        // acquire's is.
        self.undo_shared(&lease, (sent, self.inner.sql.shared_waits()), "")
            .await;
    }
}
