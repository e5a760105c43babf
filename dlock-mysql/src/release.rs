//! Release, now or after a hold, and the undo of an acquire whose outcome
//! is unknown; a release wakes the name's waiters.

use std::time::Duration;

use dlock_core::{Error, Lease, OwnerToken, Result};
use tokio::time::{Instant, timeout_at};

use crate::backend::MySqlBackend;
use crate::error::{ER_NO_SUCH_THREAD, RolledBack, server_error_number, timed_out};
use crate::pool::{Lent, Mark};
use dlock_core::driver::micros_up;

impl MySqlBackend {
    /// [`Driver::release`](dlock_core::driver::Driver::release) of a mutex.
    pub(crate) async fn release_mutex(&self, lease: &Lease) -> Result<()> {
        let by = self.deadline();
        if self
            .release_row(lease.name(), lease.owner(), "release", by)
            .await?
            != 1
        {
            return Err(Error::not_held(lease.name()));
        }
        Ok(())
    }

    /// [`Driver::release_after`](dlock_core::driver::Driver::release_after)
    /// of a mutex.
    pub(crate) async fn hold_mutex(&self, lease: &Lease, hold: Duration) -> Result<()> {
        // The row expires on the database clock.
        let query = sqlx::query(self.inner.sql.hold.clone())
            .bind(lease.owner().for_hold().to_string())
            .bind(micros_up(hold).max(1))
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.inner.pool.own_row(query, lease, "release_after").await
    }

    /// Releases `name` if `owner` holds it, retrying while the database is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    /// The acquire went out on the connection `sent_on`, where it may still
    /// wait to run (in a socket buffer, behind a row lock): that connection
    /// is ended first, so that the acquire cannot grant after the release.
    pub(crate) async fn undo(&self, name: &str, owner: OwnerToken, ttl: Duration, sent_on: Mark) {
        let released = self
            .inner
            .pool
            .retry_in_background(ttl, || async {
                let by = self.deadline();
                self.end_connection(&sent_on, by).await?;
                self.release_row(name, owner, "undo an acquire", by).await
            })
            .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }

    /// Ends the connection `mark` names, if the server still has it, and
    /// waits until the server is done with it: whatever was sent on it has
    /// then run, or never will.
    ///
    /// The id comes from the server's own record of who holds the mark's
    /// named lock, and the `KILL` goes on the same connection as that read:
    /// a server restarted in between (which could give the id to another
    /// client) breaks this connection first. An id other than the one the
    /// connection reported for itself means a proxy between that numbers
    /// connections its own way: nothing is killed then.
    pub(crate) async fn end_connection(&self, mark: &Mark, by: Instant) -> Result<()> {
        const DOING: &str = "undo an acquire";
        let mut lent = self.inner.pool.lend(DOING, by).await?;
        let conn = lent.conn();
        let holder = sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(&*mark.lock)
            .fetch_one(&mut *conn);
        match self
            .inner
            .pool
            .answer(timeout_at(by, holder).await, DOING)?
        {
            // Gone already.
            None => {}
            Some(id) if id != mark.id => {
                tracing::warn!(
                    id,
                    expected = mark.id,
                    "cannot end the connection of an acquire of unknown outcome: \
                     the server numbers it differently (a proxy?)"
                );
            }
            Some(id) => {
                let kill = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")));
                match timeout_at(by, sqlx::Executor::execute(&mut *conn, kill)).await {
                    Ok(Err(e)) if server_error_number(&e) == Some(ER_NO_SUCH_THREAD) => {}
                    done => {
                        self.inner.pool.answer(done, DOING)?;
                    }
                }
                // The lock frees when the connection has ended: wait for it
                // (for half the time left, so that the answer comes in time).
                let left = by.saturating_duration_since(Instant::now()) / 2;
                let ended = sqlx::query_scalar::<_, Option<i64>>(
                    "SELECT IF(GET_LOCK(?, ?), RELEASE_LOCK(?), 0)",
                )
                .bind(&*mark.lock)
                .bind(left.as_secs_f64())
                .bind(&*mark.lock)
                .fetch_one(&mut *conn);
                if self.inner.pool.answer(timeout_at(by, ended).await, DOING)? != Some(1) {
                    return Err(timed_out(format!(
                        "{DOING}: the connection it went out on has not ended yet"
                    )));
                }
            }
        }
        lent.give_back();
        Ok(())
    }

    /// Releases `name` if `owner` holds it (the plain release, or an
    /// undo) and wakes its waiters: those in this process, and the first
    /// queued one, whose connection the statement reports. The kill goes
    /// on the same connection as the release, so that it reaches the
    /// server that read the registration. A release InnoDB rolled back
    /// (a deadlock with a look at the queue) changed nothing, and is sent
    /// again. Returns rows matched.
    async fn release_row(
        &self,
        name: &str,
        owner: OwnerToken,
        doing: &str,
        by: Instant,
    ) -> Result<u64> {
        let owner = owner.to_string();
        let mut rolled_back = RolledBack::default();
        let (done, lent) = loop {
            let query = sqlx::query(self.inner.sql.release.clone())
                .bind(name.as_bytes())
                .bind(owner.as_str());
            let mut lent = self.inner.pool.lend(doing, by).await?;
            match timeout_at(by, query.execute(lent.conn())).await {
                Ok(Err(e)) if rolled_back.again(&e) => {
                    lent.give_back();
                    rolled_back.pause(by).await;
                }
                done => break (done, lent),
            }
        };
        let sleeper = match &done {
            // Whatever this client's own setting: only a client with
            // wake-ups queues and sleeps, and the lock goes to it.
            Ok(Ok(r)) if r.rows_affected() == 1 => r.last_insert_id(),
            _ => 0,
        };
        if sleeper == 0 {
            let rows = self.inner.pool.settle(lent, done, doing)?.rows_affected();
            if rows == 1 {
                self.inner.wakeups.wake(name);
            }
            return Ok(rows);
        }
        self.wake_sleepers(lent, [sleeper], name, by).await;
        self.inner.wakeups.wake(name);
        Ok(1)
    }

    /// Ends the sleeps of the registered waiters on the connections `ids`,
    /// with `lent`, the connection of the change that may let them in (so
    /// that the kills reach the server that read the registrations), then
    /// gives it back. Only the waiters' own connections are ever
    /// registered, so this cuts short nothing but a sleep. A user who may
    /// not kill those connections (another MySQL user) gets an error, and
    /// the waiter wakes at the end of the lease or of its poll. The change
    /// is done: a kill without an answer by `by` changes nothing in what
    /// the caller returns.
    pub(crate) async fn wake_sleepers(
        &self,
        mut lent: Lent<'_>,
        ids: impl IntoIterator<Item = u64>,
        name: &str,
        by: Instant,
    ) {
        for id in ids {
            let kill = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {id}")));
            match timeout_at(by, kill.execute(lent.conn())).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.as_database_error().is_some() => {
                    tracing::debug!(name, error = %e, "could not wake a registered waiter");
                }
                // The connection's state is unknown: it is closed, not reused.
                _ => return,
            }
        }
        lent.give_back();
    }
}
