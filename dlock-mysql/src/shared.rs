//! Reader-writer locks and semaphores: the calls of the shared kinds of
//! lock, on the transactions of `sql/shared.rs`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::async_trait;
use dlock_core::driver::micros_up;
use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::Attempt;
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use dlock_sql::{SharedKinds, SharedStatements};
use sqlx::mysql::MySqlRow;
use sqlx::{Row, SqlStr};
use tokio::time::{Instant, timeout_at};

use crate::backend::{MySqlBackend, NAME};
use crate::error::{RolledBack, procedure_gone};
use crate::extend::{Extended, owned_keys};
use crate::pool::{Lent, Mark};

/// The one row a shared call's transaction answers with.
fn one_row<'r>(rows: &'r [MySqlRow], doing: &str) -> Result<&'r MySqlRow> {
    rows.last()
        .ok_or_else(|| Error::malformed(NAME, doing, "no row"))
}

/// The value a shared call's transaction answers with.
fn value(rows: &[MySqlRow], doing: &str) -> Result<Option<i64>> {
    one_row(rows, doing)?
        .try_get(0)
        .map_err(|e| Error::backend(NAME, doing, e))
}

impl MySqlBackend {
    /// Runs one shared call's transaction, by `by`, with `mark` told the
    /// connection it goes out on (for an undo). A connection goes back to
    /// the pool only after a whole answer: a transaction that failed
    /// midway may still be open on it. One that InnoDB rolled back is sent
    /// again.
    async fn transact(
        &self,
        sql: impl Fn() -> SqlStr,
        doing: &str,
        by: Instant,
        mark: impl FnMut(Mark),
    ) -> Result<Vec<MySqlRow>> {
        let (rows, lent) = self.transact_on(sql, doing, by, mark).await?;
        lent.give_back();
        Ok(rows)
    }

    /// [`Self::transact`], keeping the connection for what follows.
    async fn transact_on(
        &self,
        sql: impl Fn() -> SqlStr,
        doing: &str,
        by: Instant,
        mut mark: impl FnMut(Mark),
    ) -> Result<(Vec<MySqlRow>, Lent<'_>)> {
        let (mut rolled_back, mut as_text) = (RolledBack::default(), false);
        loop {
            let mut lent = self.inner.pool.lend(doing, by).await?;
            mark(lent.mark());
            let done = timeout_at(by, sqlx::raw_sql(sql()).fetch_all(lent.conn())).await;
            match done {
                Ok(Ok(rows)) => return Ok((rows, lent)),
                Ok(Err(e)) if rolled_back.again(&e) => rolled_back.pause(by).await,
                Ok(Err(e)) if procedure_gone(&e) && !as_text => {
                    // Dropped since `connect` saw it, or made unusable (an
                    // administrator, a restore): the call did nothing, and
                    // this backend goes back to the text, for good.
                    if self.inner.sql.call.swap(false, Relaxed) {
                        tracing::warn!(
                            table = self.inner.sql.table,
                            error = %e,
                            "the lock table's procedures cannot be called: shared calls go as text"
                        );
                    }
                    as_text = true;
                    lent.give_back();
                }
                done => {
                    let rows = self.inner.pool.answer(done, doing)?;
                    return Ok((rows, lent));
                }
            }
        }
    }

    /// Runs an acquire's transaction with `in_flight` holding the connection
    /// it goes out on until an answer settles it: any answer from the
    /// server means it is no longer on its way. With no answer the mark
    /// stays, for the undo, which ends that connection first.
    async fn transact_in_flight(
        &self,
        sql: impl Fn() -> SqlStr,
        in_flight: &Arc<Mutex<Option<Mark>>>,
    ) -> Result<Vec<MySqlRow>> {
        let rows = self
            .transact(sql, "acquire", self.deadline(), |mark| {
                *in_flight.lock().unwrap_or_else(PoisonError::into_inner) = Some(mark);
            })
            .await;
        if !matches!(&rows, Err(e) if e.is_retryable()) {
            in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
        rows
    }

    /// One acquire of a shared kind, not queued.
    pub(crate) async fn attempt_shared(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        self.look(name, opts, "", &Arc::default()).await
    }

    /// One acquire, queued as `waiter` (`""`: not queued; a mutex's is
    /// then the plain acquire). While its transaction is on its way,
    /// `in_flight` holds the connection it went out on.
    pub(crate) async fn look(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
        in_flight: &Arc<Mutex<Option<Mark>>>,
    ) -> Result<Attempt> {
        let mode = opts.get_mode();
        if mode == Mode::Exclusive {
            return self.attempt_mutex(name, opts, waiter).await;
        }
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let sql = || {
            self.inner.sql.acquire_shared(
                name.as_bytes(),
                &owner.to_string(),
                mode,
                micros_up(opts.get_ttl()),
                opts.get_holder(),
                waiter,
                micros_up(self.place()),
            )
        };
        // Armed while the outcome is unknown, as for the mutex: the undo
        // ends the connection the transaction went out on, then releases.
        let mut undo = {
            let (backend, sent_on) = (self.clone(), in_flight.clone());
            let lease = Lease::with_ttl(name, owner, 0, opts, sent);
            let waiter = waiter.to_owned();
            UndoOnDrop::new(async move {
                let mark = sent_on
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                backend.undo_shared(&lease, mark, &waiter).await;
            })
        };
        let rows = self.transact_in_flight(sql, in_flight).await;
        // No answer (a timeout, a broken connection) leaves the undo armed,
        // to run as this returns: the transaction may still be running,
        // and a release before its commit would find nothing.
        if !matches!(&rows, Err(e) if e.is_retryable()) {
            undo.disarm();
        }
        let rows = rows?;
        let row = one_row(&rows, "acquire")?;
        let read = |e| Error::backend(NAME, "acquire", e);
        let conflict: Option<Vec<u8>> = row.try_get(1).map_err(read)?;
        let answer = (
            row.try_get(0).map_err(read)?,
            conflict.map(|kind| String::from_utf8_lossy(&kind).into_owned()),
            row.try_get(2).map_err(read)?,
        );
        self.shared_outcome(name, opts, (owner, sent), answer)
    }

    /// Queues `waiter` without the name's row lock (see
    /// [`Statements::enqueue_shared`](crate::sql::Statements)): `None`
    /// when the acquire's rule lets it in now, for a look to take the
    /// grant, else the outcome of a refused look.
    /// While it is on its way, `in_flight` holds the connection it went out
    /// on: a wait dropped meanwhile ends that connection before it gives
    /// the place up, or the place could be written after its removal.
    pub(crate) async fn enqueue_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
        in_flight: &Arc<Mutex<Option<Mark>>>,
    ) -> Result<Option<Attempt>> {
        let place = micros_up(self.place());
        let sql = || {
            self.inner
                .sql
                .enqueue_shared(name.as_bytes(), opts.get_mode(), waiter, place)
        };
        let rows = self.transact_in_flight(sql, in_flight).await?;
        let row = one_row(&rows, "acquire")?;
        let read = |e| Error::backend(NAME, "acquire", e);
        if row.try_get::<Option<i64>, _>(1).map_err(read)? == Some(1) {
            return Ok(None);
        }
        let conflict: Option<Vec<u8>> = row.try_get(0).map_err(read)?;
        let conflict = conflict.map(|kind| String::from_utf8_lossy(&kind).into_owned());
        self.refused(name, opts, conflict, row.try_get(2).map_err(read)?)
            .map(Some)
    }

    /// Gives a waiter's place up (a writer that leaves may let readers in).
    /// On the waiter's own path when its wait ended; a dropped wait's
    /// runs in the pool's background turns (see `wait.rs`).
    pub(crate) async fn abandon(&self, name: &str, waiter: &str) {
        let left = retry_for(self.inner.request_timeout * 2, || async {
            let sql = self
                .inner
                .sql
                .abandon(name.as_bytes(), waiter, self.inner.wake_ups);
            self.change(sql, name, "leave the queue").await
        })
        .await;
        self.inner.wakeups.wake(name);
        tracing::debug!(name, left = left.is_some(), "left the queue");
    }

    /// Undoes a queued or shared acquire of unknown outcome: ends the connection it
    /// went out on (`sent_on`, when known), so that it cannot grant after
    /// this, then releases by owner until the server answers or the TTL
    /// has freed the hold anyway. `waiter` (`""`: not queued) gets its
    /// place in the queue back if the acquire was granted from it: a
    /// waiter that lost its place to a grant it never heard of would queue
    /// anew behind later writers, and readers let in beside it would hold
    /// those writers off while it waits behind them. The release's wake-ups
    /// are read after its commit: they find the place back.
    async fn undo_shared(&self, lease: &Lease, sent_on: Option<Mark>, waiter: &str) {
        let ttl = lease.ttl().unwrap_or_default();
        let released = self
            .inner
            .pool
            .retry_in_background(ttl, || async {
                if let Some(mark) = &sent_on {
                    self.end_connection(mark, self.deadline()).await?;
                }
                match self.end_shared(lease, waiter).await {
                    Err(Error::NotHeld { .. }) => Ok(false),
                    other => other.map(|()| true),
                }
            })
            .await;
        tracing::debug!(
            name = lease.name(),
            ?released,
            "undid an acquire of unknown outcome"
        );
    }

    /// Wakes the waiters that a change's rows (theirs, then its own last
    /// row) say it let in, when it changed anything (`changed`), on the
    /// connection it ran on, which then goes back to the pool.
    async fn wake_after(
        &self,
        lent: Lent<'_>,
        rows: &[MySqlRow],
        changed: i64,
        name: &str,
        by: Instant,
    ) {
        if changed == 0 {
            lent.give_back();
            return;
        }
        let mut sleepers = Vec::new();
        for row in &rows[..rows.len().saturating_sub(1)] {
            if let Ok(Some(id)) = row.try_get::<Option<i64>, _>(0)
                && let Ok(id @ 1..) = u64::try_from(id)
            {
                sleepers.push(id);
            }
        }
        self.wake_sleepers(lent, sleepers, name, by).await;
        self.inner.wakeups.wake(name);
    }

    /// Lowers the marker of a name whose last hold ended and that let
    /// nobody in, so that it may be used as another kind at once. Left up,
    /// it lapses at its longest hold's end; a failed try goes on in the
    /// pool's background turns for up to `ttl`, the release being done.
    async fn settle_marker(&self, name: &str, ttl: Duration) {
        let settle = |backend: Self, name: String| async move {
            let sql = || backend.inner.sql.settle_marker(name.as_bytes());
            backend
                .transact(sql, "release", backend.deadline(), drop)
                .await
                .map(drop)
        };
        if let Err(error) = settle(self.clone(), name.to_owned()).await {
            tracing::debug!(name, %error, "could not lower the marker yet");
            let (backend, name) = (self.clone(), name.to_owned());
            tokio::spawn(async move {
                let settled = backend
                    .inner
                    .pool
                    .retry_in_background(ttl, || settle(backend.clone(), name.clone()))
                    .await;
                tracing::debug!(
                    name,
                    settled = settled.is_some(),
                    "lowered the marker later"
                );
            });
        }
    }

    /// Extends shared leases, one transaction per TTL; says which ones it
    /// did.
    pub(crate) async fn extend_shared(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let by = self.deadline();
        self.extend_per_ttl(leases, |batch, ttl| async move {
            let sql = self.inner.sql.extend_shared(&batch, micros_up(ttl));
            let rows = self.transact(|| sql.clone(), "extend", by, drop).await?;
            Ok(Extended::Owned(owned_keys(&rows)))
        })
        .await
    }
}

#[async_trait]
impl SharedKinds for MySqlBackend {
    type Stmt = SqlStr;

    fn statements(&self) -> &dyn SharedStatements<Stmt = SqlStr> {
        &self.inner.sql
    }

    fn wakes_others(&self) -> bool {
        self.inner.wake_ups
    }

    fn max_poll(&self) -> Duration {
        self.inner.max_poll
    }

    fn token(&self, fence: i64, doing: &str) -> Result<u64> {
        u64::try_from(fence)
            .map_err(|_| Error::malformed(NAME, &format!("{doing} (the fencing token)"), fence))
    }

    /// The rows of a change are the waiters to wake, then the count; the
    /// waiters it may have let in are those of this process and those
    /// sleeping in the server (by `wait::waiter_key`).
    async fn change(&self, sql: SqlStr, name: &str, doing: &str) -> Result<i64> {
        let by = self.deadline();
        let (rows, lent) = self.transact_on(|| sql.clone(), doing, by, drop).await?;
        let changed = value(&rows, doing)?.unwrap_or(0);
        self.wake_after(lent, &rows, changed, name, by).await;
        Ok(changed)
    }

    /// A read or a permit ends without the name's row lock (see
    /// `Statements::release_unlocked`): in a crowd every release took that
    /// lock in turn, in the way of every grant. A write's release, which
    /// lets in whoever waits, keeps the locked change.
    async fn release_shared(&self, lease: &Lease) -> Result<()> {
        if lease.mode() == Mode::Write {
            return self.end_shared(lease, "").await;
        }
        const DOING: &str = "release";
        let (name, owner) = (lease.name(), lease.owner().to_string());
        let sql = || {
            self.inner
                .sql
                .release_unlocked(name.as_bytes(), &owner, self.inner.wake_ups)
        };
        let by = self.deadline();
        let (rows, lent) = self.transact_on(sql, DOING, by, drop).await?;
        let last = one_row(&rows, DOING)?;
        let read = |e| Error::backend(NAME, DOING, e);
        let (ended, left, marked, longest): (Option<i64>, i64, i64, i64) = (
            last.try_get(0).map_err(read)?,
            last.try_get(1).map_err(read)?,
            last.try_get(2).map_err(read)?,
            last.try_get(3).map_err(read)?,
        );
        let ended = ended.unwrap_or(0);
        let admitted = rows.len() > 1;
        self.wake_after(lent, &rows, ended, name, by).await;
        // Nothing held and nobody let in, or the longest hold gone: the
        // marker comes down to the longest hold left, so that the name
        // may be used as another kind as soon as its holds allow.
        if ended > 0 && marked != 0 && ((left == 0 && !admitted) || (left > 0 && longest != 0)) {
            self.settle_marker(name, lease.ttl().unwrap_or_default())
                .await;
        }
        if ended != 1 {
            return Err(Error::not_held(name));
        }
        Ok(())
    }

    async fn value(&self, sql: SqlStr, doing: &str) -> Result<Option<i64>> {
        let rows = self
            .transact(|| sql.clone(), doing, self.deadline(), drop)
            .await?;
        value(&rows, doing)
    }

    async fn undo_downgrade(&self, lease: Lease, _sent: Instant) {
        self.undo_shared(&lease, None, "").await;
    }
}
