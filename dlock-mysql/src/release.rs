//! Release, now or after a hold, and the undo of an acquire whose outcome
//! is unknown; a release wakes the name's waiters.

use std::time::Duration;

use dlock_core::undo::retry_for;
use dlock_core::{Error, Lease, OwnerToken, Result};
use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::Query;
use tokio::time::timeout;

use crate::backend::MySqlBackend;
use crate::pool::settle;
use dlock_core::micros_up;

impl MySqlBackend {
    /// [`Backend::release`](dlock_core::Backend::release).
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let query = sqlx::query(self.inner.sql.release.clone())
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        if self.release_row(query, lease.name(), "release").await? != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        Ok(())
    }

    /// [`Backend::release_after`](dlock_core::Backend::release_after), with
    /// `hold` checked already.
    pub(crate) async fn release_lease_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if hold.is_zero() {
            return self.release_lease(lease).await;
        }
        // The row expires on the database clock.
        let query = sqlx::query(self.inner.sql.hold.clone())
            .bind(lease.owner().for_hold().to_string())
            .bind(micros_up(hold).max(1))
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.own_row(query, lease, "release_after").await
    }

    /// Releases `name` if `owner` holds it, retrying while the database is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    pub(crate) async fn undo(&self, name: &str, owner: OwnerToken, ttl: Duration) {
        let released = retry_for(ttl, || async {
            let query = sqlx::query(self.inner.sql.release.clone())
                .bind(name.as_bytes())
                .bind(owner.to_string());
            self.release_row(query, name, "undo an acquire").await
        })
        .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }

    /// Runs a release statement for `name` (the plain release, or an
    /// undo) and wakes its waiters: those in this process, and the waiter
    /// registered for the name, whose connection the statement reports.
    /// The kill goes on the same connection as the release, so that it
    /// reaches the server that read the registration. Returns rows matched.
    async fn release_row(
        &self,
        query: Query<'_, MySql, MySqlArguments>,
        name: &str,
        doing: &str,
    ) -> Result<u64> {
        let limit = self.inner.request_timeout;
        let mut lent = self.lend(doing).await?;
        let done = timeout(limit, query.execute(lent.conn())).await;
        let sleeper = match &done {
            Ok(Ok(r)) if r.rows_affected() == 1 && self.inner.wake_ups => r.last_insert_id(),
            _ => 0,
        };
        if sleeper == 0 {
            let rows = settle(lent, done, limit, doing)?.rows_affected();
            if rows == 1 {
                self.inner.wakeups.wake(name);
            }
            return Ok(rows);
        }
        // Only the waiters' own connections are ever registered, so this
        // cuts short nothing but a sleep. A user who may not kill that
        // connection (another MySQL user) gets an error, and the waiter
        // wakes at the end of the lease or of its poll.
        let kill = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {sleeper}")));
        match timeout(limit, kill.execute(lent.conn())).await {
            Ok(Ok(_)) => lent.give_back(),
            Ok(Err(e)) if e.as_database_error().is_some() => {
                tracing::debug!(name, error = %e, "could not wake the registered waiter");
                lent.give_back();
            }
            // The connection's state is unknown: it is closed, not reused.
            _ => drop(lent),
        }
        self.inner.wakeups.wake(name);
        Ok(1)
    }
}
