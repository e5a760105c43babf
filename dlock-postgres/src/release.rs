//! Release, now or after a hold, and the undo of an acquire whose outcome
//! is unknown.

use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::{Error, Lease, OwnerToken, Result};
use sqlx::Row;
use tokio::time::Instant;

use crate::backend::PgBackend;
use crate::error::timed_out;

impl PgBackend {
    /// [`Driver::release`](dlock_core::driver::Driver::release) of a mutex.
    pub(crate) async fn release_mutex(&self, lease: &Lease) -> Result<()> {
        let owner = lease.owner().to_string();
        if !self.release_row(lease.name(), &owner, "release").await? {
            return Err(Error::not_held(lease.name()));
        }
        Ok(())
    }

    /// [`Driver::release_after`](dlock_core::driver::Driver::release_after)
    /// of a mutex.
    pub(crate) async fn hold_mutex(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let (owner, hold_owner) = (lease.owner().to_string(), lease.owner().for_hold());
        let sql = self.inner.sql.hold(
            lease.name().as_bytes(),
            &owner,
            &hold_owner.to_string(),
            micros_up(hold).max(1),
        );
        self.own_row(sql, lease, "release_after").await
    }

    /// Frees `name` if `owner` holds it, and wakes this process's waiter
    /// the release lets in: with wake-ups on, the one it announced to
    /// every process (the first in the name's queue), else every waiter
    /// of the name here. `true` when it freed the name.
    async fn release_row(&self, name: &str, owner: &str, doing: &str) -> Result<bool> {
        if self.inner.listen.is_none() {
            let sql = self.inner.sql.release(name.as_bytes(), owner);
            let released = self
                .execute(sql, doing, self.deadline())
                .await?
                .rows_affected()
                == 1;
            if released {
                self.inner.wakeups.wake(name);
            }
            return Ok(released);
        }
        let sql = self.inner.sql.release_and_notify(name.as_bytes(), owner);
        let rows = self.fetch(sql, doing, self.deadline()).await?;
        let Some(row) = rows.iter().rev().find(|row| !row.is_empty()) else {
            return Ok(false);
        };
        let read = |e| Error::backend(crate::backend::NAME, doing, e);
        if self.inner.sql.counts_places() {
            let (unseen, head): (bool, Option<String>) =
                (row.try_get(0).map_err(read)?, row.try_get(1).map_err(read)?);
            if let Some(head) = &head {
                self.inner.queued_wakeups.wake(head);
            }
            if unseen {
                // A place came while the release waited for the row, which
                // its read of the queue could not see; the head it read
                // may have left meanwhile too.
                self.announce_head(name, doing).await;
            }
        } else {
            let head: String = row.try_get(0).map_err(read)?;
            if !head.is_empty() {
                self.inner.queued_wakeups.wake(&head);
            }
        }
        // Waiters of a backend whose listener gave up poll by name.
        self.inner.wakeups.wake(name);
        Ok(true)
    }

    /// Announces the first waiter of `name`, read after a release's commit;
    /// one that fails leaves that waiter to its next look.
    async fn announce_head(&self, name: &str, doing: &str) {
        let sql = self.inner.sql.announce_head(name.as_bytes());
        match self.fetch(sql, doing, self.deadline()).await {
            Ok(rows) => {
                let head: Option<String> = rows.first().and_then(|row| row.try_get(0).ok());
                if let Some(head) = head {
                    self.inner.queued_wakeups.wake(&head);
                }
            }
            Err(error) => tracing::debug!(name, %error, "could not announce the next waiter"),
        }
    }

    /// Releases `name` if `owner` holds it, retrying while the database is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    /// The acquire, sent at `sent`, may still be running in the server and
    /// commit until the `statement_timeout` of each of the `waits`
    /// statements of its query that may wait (see `Stmt::waits`) has ended
    /// them, the query having started at most one request timeout later: a
    /// release that found nothing looks again until then.
    pub(crate) async fn undo(
        &self,
        name: &str,
        owner: OwnerToken,
        ttl: Duration,
        (sent, waits): (Instant, u32),
    ) {
        let owner = owner.to_string();
        let settled_by = sent + self.inner.request_timeout * (1 + waits);
        let released = self
            .inner
            .pool
            .retry_in_background(ttl, || async {
                let released = self.release_row(name, &owner, "undo an acquire").await?;
                if !released && Instant::now() < settled_by {
                    return Err(timed_out(
                        "undo an acquire: nothing to release yet; it may still commit".to_owned(),
                    ));
                }
                Ok(released)
            })
            .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }
}
