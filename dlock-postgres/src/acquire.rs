//! One acquire attempt: a single `INSERT … ON CONFLICT DO UPDATE … WHERE
//! expired`, undone by its owner token when its outcome is unknown.

use dlock_core::undo::UndoOnDrop;
use dlock_core::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, OwnerToken, Result, micros_up};
use sqlx::Row;
use tokio::time::{Instant, timeout_at};

use crate::backend::{NAME, PgBackend};
use crate::pool::settle;

impl PgBackend {
    /// One attempt to take `name`: the lease, or "held" (also for a grant
    /// whose reply came after its validity deadline; see [`on_arrival`]).
    pub(crate) async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        if let Some(fence) = self.grant(name, owner, opts, sent).await? {
            let lease = Lease::with_ttl(name, owner, fence, opts, sent);
            return Ok(on_arrival(self, lease));
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// One acquire statement: the granted fencing token, or `None` when
    /// the lock is held.
    async fn grant(
        &self,
        name: &str,
        owner: OwnerToken,
        opts: &LockOptions,
        sent: Instant,
    ) -> Result<Option<u64>> {
        let ttl = opts.ttl_value();
        let owner_text = owner.to_string();
        let sql = self.inner.sql.acquire(
            name.as_bytes(),
            &owner_text,
            micros_up(ttl),
            &self.inner.holder,
        );
        let by = self.deadline();
        let mut lent = self.lend("acquire", by).await?;
        // Armed from the moment the statement may reach the server until
        // its reply is in: one that timed out, or whose future was dropped,
        // may still have taken the lock.
        let mut undo = {
            let (backend, name) = (self.clone(), name.to_owned());
            UndoOnDrop::new(async move { backend.undo(&name, owner, ttl, sent).await })
        };
        let done = timeout_at(by, sqlx::raw_sql(sql).fetch_optional(lent.conn())).await;
        // Any answer from the server settles the outcome (an error was
        // rolled back).
        if matches!(&done, Ok(Ok(_)))
            || matches!(&done, Ok(Err(e)) if e.as_database_error().is_some())
        {
            undo.disarm();
        }
        let Some(row) = settle(lent, done, self.inner.request_timeout, "acquire")? else {
            return Ok(None);
        };
        let fence: i64 = row
            .try_get(0)
            .map_err(|e| Error::backend(NAME, "acquire (the fencing token)", e))?;
        u64::try_from(fence)
            .ok()
            .filter(|&f| f > 0)
            .map(Some)
            .ok_or_else(|| Error::malformed(NAME, "acquire (the fencing token)", fence))
    }
}
