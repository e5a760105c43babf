//! Release, now or after a hold, and the undo of an acquire whose outcome
//! is unknown.

use std::time::Duration;

use dlock_core::undo::retry_for;
use dlock_core::{Error, Lease, Mode, OwnerToken, Result, micros_up};
use tokio::time::Instant;

use crate::backend::PgBackend;
use crate::error::timed_out;

impl PgBackend {
    /// [`Backend::release`](dlock_core::Backend::release).
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        if lease.mode() != Mode::Exclusive {
            return self.release_shared(lease).await;
        }
        let owner = lease.owner().to_string();
        let sql = self.release_sql(lease.name(), &owner);
        let done = self.execute(sql, "release", self.deadline()).await?;
        if done.rows_affected() != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        self.inner.wakeups.wake(lease.name());
        Ok(())
    }

    /// [`Backend::release_after`](dlock_core::Backend::release_after), with
    /// `hold` checked already.
    pub(crate) async fn release_lease_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if hold.is_zero() {
            return self.release_lease(lease).await;
        }
        if lease.mode() != Mode::Exclusive {
            return self.hold_shared(lease, hold).await;
        }
        let (owner, hold_owner) = (lease.owner().to_string(), lease.owner().for_hold());
        let sql = self.inner.sql.hold(
            lease.name().as_bytes(),
            &owner,
            &hold_owner.to_string(),
            micros_up(hold).max(1),
        );
        self.own_row(sql, lease, "release_after").await
    }

    /// The release of `name` by `owner`: announced to other processes'
    /// waiters with wake-ups on. Either reports one row when released (a
    /// row changed, or one notification selected).
    fn release_sql(&self, name: &str, owner: &str) -> sqlx::SqlStr {
        if self.inner.listen.is_some() {
            self.inner.sql.release_and_notify(name.as_bytes(), owner)
        } else {
            self.inner.sql.release(name.as_bytes(), owner)
        }
    }

    /// Releases `name` if `owner` holds it, retrying while the database is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    /// The acquire, sent at `sent`, may still be running in the server and
    /// commit until its `statement_timeout` (the request timeout from when
    /// it started, at most one more request timeout later) ends it: a
    /// release that found nothing looks again until then.
    pub(crate) async fn undo(&self, name: &str, owner: OwnerToken, ttl: Duration, sent: Instant) {
        let owner = owner.to_string();
        let settled_by = sent + self.inner.request_timeout * 2;
        let released = retry_for(ttl, || async {
            let sql = self.release_sql(name, &owner);
            let done = self
                .execute(sql, "undo an acquire", self.deadline())
                .await?;
            if done.rows_affected() == 1 {
                self.inner.wakeups.wake(name);
            } else if Instant::now() < settled_by {
                return Err(timed_out(
                    "undo an acquire: nothing to release yet; it may still commit".to_owned(),
                ));
            }
            Ok(done.rows_affected())
        })
        .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }
}
