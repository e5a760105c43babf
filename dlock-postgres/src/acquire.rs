//! One acquire attempt: a single `INSERT … ON CONFLICT DO UPDATE … WHERE
//! expired`, undone by its owner token when its outcome is unknown.

use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use dlock_sql::SharedKinds;
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::{Instant, timeout_at};

use crate::backend::{NAME, PgBackend};
use crate::pool::fetch_on;

impl PgBackend {
    /// One attempt to take `name`: the lease, or "held" (also for a grant
    /// whose reply came after its validity deadline; see [`on_arrival`]).
    pub(crate) async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        if opts.get_mode() != Mode::Exclusive {
            return self.attempt_shared(name, opts, "").await;
        }
        self.attempt_as(name, opts, "").await
    }

    /// One attempt to take `name` as a mutex, queued as `waiter` (`""`:
    /// not queued; see [`Statements::acquire`](crate::sql::Statements::acquire)).
    pub(crate) async fn attempt_as(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let (row, sent) = self.grant(name, owner, opts, waiter).await?;
        let Some(row) = row else {
            return Ok(Attempt::Held { expires_in: None });
        };
        let read = |e| Error::backend(NAME, "acquire", e);
        if let Some(fence) = row.try_get::<Option<i64>, _>(0).map_err(read)? {
            let lease = Lease::with_ttl(name, owner, token(fence, "acquire")?, opts, sent);
            return Ok(on_arrival(self, lease));
        }
        let holder: Option<String> = row.try_get(1).map_err(read)?;
        let left: Option<i64> = row.try_get(2).map_err(read)?;
        let left = left
            .and_then(|us| u64::try_from(us).ok())
            .filter(|&us| us > 0);
        match holder {
            Some(kind) if kind.starts_with('~') && left.is_some() => Err(Error::ModeConflict {
                name: name.to_owned(),
                held: Mode::of_marker(&kind),
                asked: Mode::Exclusive,
            }),
            _ => Ok(Attempt::Held {
                expires_in: left.map(Duration::from_micros),
            }),
        }
    }

    /// One acquire statement: its row (see [`Statements::acquire`](crate::sql::Statements::acquire)),
    /// and when it was sent.
    async fn grant(
        &self,
        name: &str,
        owner: OwnerToken,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<(Option<PgRow>, Instant)> {
        let ttl = opts.get_ttl();
        let owner_text = owner.to_string();
        let sql = self.inner.sql.acquire(
            name.as_bytes(),
            &owner_text,
            micros_up(ttl),
            opts.get_holder(),
            waiter,
            micros_up(self.place()),
        );
        let by = self.deadline();
        let mut lent = self.inner.pool.lend("acquire", by).await?;
        // The lease is counted from here, not from before the wait for a
        // connection: the server starts its TTL only when the statement
        // runs, and a loaded pool would otherwise eat into every lease.
        let sent = Instant::now();
        // Armed from the moment the statement may reach the server until
        // its reply is in: one that timed out, or whose future was dropped,
        // may still have taken the lock.
        let mut undo = {
            let (backend, name) = (self.clone(), name.to_owned());
            let waits = sql.waits();
            UndoOnDrop::new(async move { backend.undo(&name, owner, ttl, (sent, waits)).await })
        };
        let done = timeout_at(by, fetch_on(&mut lent, &sql)).await;
        let done = done.map(|rows| rows.map(|rows| rows.into_iter().next()));
        // Any answer from the server settles the outcome (an error was
        // rolled back).
        if matches!(&done, Ok(Ok(_)))
            || matches!(&done, Ok(Err(e)) if e.as_database_error().is_some())
        {
            undo.disarm();
        }
        Ok((self.inner.pool.settle(lent, done, "acquire")?, sent))
    }
}

/// A fencing token as read from the database: positive.
pub(crate) fn token(fence: i64, doing: &str) -> Result<u64> {
    u64::try_from(fence)
        .ok()
        .filter(|&f| f > 0)
        .ok_or_else(|| Error::malformed(NAME, &format!("{doing} (the fencing token)"), fence))
}
