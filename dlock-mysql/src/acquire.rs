//! One acquire attempt: a single `INSERT … ON DUPLICATE KEY UPDATE` (a
//! queued waiter's: with its place written before and given up after, in
//! the same round trip), undone by its owner token when its outcome is
//! unknown.

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use sqlx::Row;
use sqlx::mysql::MySqlRow;
use tokio::time::{Instant, timeout_at};

use crate::backend::MySqlBackend;
use crate::error::RolledBack;
use crate::sql::HELD_AS_ANOTHER_KIND;
use dlock_core::driver::micros_up;

impl MySqlBackend {
    /// One attempt to take `name`: the lease, or "held" (also for a grant
    /// whose reply came after its validity deadline; see [`on_arrival`]).
    pub(crate) async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        if opts.get_mode() != Mode::Exclusive {
            return self.attempt_shared(name, opts).await;
        }
        self.attempt_mutex(name, opts, "").await
    }

    /// [`Self::attempt`] of a mutex, queued as `waiter` (see
    /// `Statements::acquire_queued`); `""`: not queued, and then held while
    /// anybody queues for it.
    pub(crate) async fn attempt_mutex(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        match self.grant(name, owner, opts, waiter).await? {
            Some(HELD_AS_ANOTHER_KIND) => return self.conflict(name).await,
            Some(version) => {
                let lease = Lease::with_ttl(name, owner, version, opts, sent);
                return Ok(on_arrival(self, lease));
            }
            None => {}
        }
        // Waiters do not need the holder's remaining lease: the registered
        // one sleeps in the server until it ends.
        Ok(Attempt::Held { expires_in: None })
    }

    /// A mutex's acquire that found `name` held as another kind: that
    /// kind, read from the name's marker, as the error; "held" when the
    /// marker went meanwhile.
    async fn conflict(&self, name: &str) -> Result<Attempt> {
        let query = sqlx::query_scalar(self.inner.sql.kind.clone()).bind(name.as_bytes());
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("acquire", by).await?;
        let done = timeout_at(by, query.fetch_optional(lent.conn())).await;
        let owner: Option<String> = self.inner.pool.settle(lent, done, "acquire")?;
        match owner {
            Some(marker) if marker.starts_with('~') => Err(Error::ModeConflict {
                name: name.to_owned(),
                held: Mode::of_marker(&marker),
                asked: Mode::Exclusive,
            }),
            _ => Ok(Attempt::Held { expires_in: None }),
        }
    }

    /// One acquire statement (a queued waiter's: three, in one round
    /// trip). Returns the granted version, or `None` when the lock is held.
    async fn grant(
        &self,
        name: &str,
        owner_token: OwnerToken,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Option<u64>> {
        let (lease_ttl, holder) = (opts.get_ttl(), opts.get_holder());
        let owner_text = owner_token.to_string();
        let (owner, ttl) = (owner_text.as_str(), micros_up(lease_ttl));
        let queued = (!waiter.is_empty()).then(|| {
            // A sleeping waiter looks again within a poll interval, and each
            // sleep and look within a request timeout: a place lapses
            // soon after its waiter stops looking.
            let place = micros_up(self.inner.max_poll + self.inner.request_timeout * 3);
            let sql = &self.inner.sql;
            sql.acquire_queued(name.as_bytes(), owner, (ttl, holder), waiter, place)
        });
        let mut rolled_back = RolledBack::default();
        let by = self.deadline();
        loop {
            let mut lent = self.inner.pool.lend("acquire", by).await?;
            // Armed from the moment the statement may reach the server until
            // its reply is in: one that timed out, or whose future was
            // dropped, may still have taken the lock, and may still be on
            // its way to the server: the undo ends its connection first.
            let mut undo = {
                let (backend, name, sent_on) = (self.clone(), name.to_owned(), lent.mark());
                UndoOnDrop::new(async move {
                    backend.undo(&name, owner_token, lease_ttl, sent_on).await;
                })
            };
            let done = match &queued {
                None => {
                    let sql = &self.inner.sql;
                    let plain = if self.inner.wake_ups {
                        &sql.acquire
                    } else {
                        &sql.acquire_unqueued
                    };
                    let query = sqlx::query(plain.clone())
                        .bind(name.as_bytes())
                        .bind(owner)
                        .bind(ttl)
                        .bind(holder.as_bytes())
                        .bind(name.as_bytes())
                        .bind(owner)
                        .bind(owner)
                        .bind(owner)
                        .bind(owner)
                        .bind(holder.as_bytes())
                        .bind(owner)
                        .bind(ttl);
                    let done = timeout_at(by, query.execute(lent.conn())).await;
                    done.map(|r| r.map(|r| r.last_insert_id()))
                }
                Some(sql) => {
                    let rows = sqlx::raw_sql(sql.clone()).fetch_all(lent.conn());
                    let done = timeout_at(by, rows).await;
                    done.map(|r| r.map(|rows| last_insert_id(&rows)))
                }
            };
            // Any answer from the server settles the outcome (an error was
            // rolled back). Disarm then, or the undo of a deadlocked try
            // would release the next try's grant: it has the same owner.
            // A queued look is three statements, and an error in the last
            // ones comes after the acquire's commit: it stays armed then,
            // unless the look is tried again, whose acquire finds the row
            // its own and grants it anew (a later version, same owner).
            let answered = match &done {
                Ok(Ok(_)) => true,
                Ok(Err(e)) if queued.is_some() => rolled_back.would_retry(e),
                Ok(Err(e)) => e.as_database_error().is_some(),
                Err(_) => false,
            };
            if answered {
                undo.disarm();
            }
            match done {
                Ok(Err(e)) if rolled_back.again(&e) => {
                    lent.give_back();
                    rolled_back.pause(by).await;
                }
                done => {
                    let version = self.inner.pool.settle(lent, done, "acquire")?;
                    return Ok((version != 0).then_some(version));
                }
            }
        }
    }
}

/// The `LAST_INSERT_ID` a queued acquire answers with (0, held, when the
/// answer has no such row).
fn last_insert_id(rows: &[MySqlRow]) -> u64 {
    rows.last()
        .and_then(|row| row.try_get::<Option<i64>, _>(0).ok().flatten())
        .and_then(|id| u64::try_from(id).ok())
        .unwrap_or(0)
}
