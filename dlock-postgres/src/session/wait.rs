//! Waiting: in the server's queue, a slice at a time.

use std::time::Duration;

use dlock_core::driver::wait::{Backoff, Deadline, RETRIES};
use dlock_core::{Error, Lease, LockOptions, OwnerToken, Result};
use tokio::time::Instant;

use super::conn::{Conn, Failure};
use super::{LOCK_NOT_AVAILABLE, PgSessionBackend, QUERY_CANCELED, WAIT_SLICE};
use crate::backend::NAME;

impl PgSessionBackend {
    /// Acquire's wait: the server queues it, a slice at a time, after a
    /// try and a look for a conflict of kinds in the same statement.
    pub(super) async fn wait_for(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        if deadline.cap(WAIT_SLICE).is_zero() {
            // No time to queue: a try.
            return match self.attempt(name, opts).await? {
                Ok(lease) => Ok(lease),
                Err(conn) => {
                    self.give_back(conn);
                    Err(deadline.timeout_error(name))
                }
            };
        }
        // A look is owed until a slice runs, and again after a failed one:
        // a wait whose connection took all its time, or that ends during
        // the backoff after a failure, looks once all the same (as the
        // lease table's wait looks at its deadline), and reports what that
        // look finds: the lock held, or the failure again.
        let (mut owed, mut failures) = (true, 0);
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        loop {
            let slice = match self
                .connection("acquire", self.deadline(), Some(name))
                .await
            {
                Ok(conn) => {
                    let mut left = deadline.cap(WAIT_SLICE);
                    if left.is_zero() {
                        if !owed {
                            self.give_back(conn);
                            return Err(deadline.timeout_error(name));
                        }
                        // The connection took the whole wait: one look all
                        // the same.
                        left = Duration::from_millis(1);
                    }
                    owed = false;
                    self.wait_slice((name, opts), conn, left).await
                }
                Err(e) => Err(e),
            };
            match slice {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => failures = 0,
                // A connection that would not open, or a slice cut off (its
                // session is ended, so it holds nothing): ridden out as the
                // lease table's wait does.
                Err(e) if e.is_retryable() && failures < RETRIES && !deadline.is_past() => {
                    failures += 1;
                    tracing::debug!(name, error = %e, "a wait's slice failed; trying again");
                    tokio::time::sleep(deadline.cap(backoff.next_delay())).await;
                    owed = true;
                    continue;
                }
                Err(e) => return Err(e),
            }
            if deadline.is_past() {
                return Err(deadline.timeout_error(name));
            }
        }
    }

    /// One wait statement on `conn`, queued up to `slice`: the lease, or
    /// `None` when the slice ran out.
    async fn wait_slice(
        &self,
        (name, opts): (&str, &LockOptions),
        mut conn: Conn,
        slice: Duration,
    ) -> Result<Option<Lease>> {
        let owner = OwnerToken::random()?;
        let ms = i64::try_from(dlock_core::driver::millis_up(slice))
            .unwrap_or(i64::MAX)
            .max(1);
        let by = Instant::now() + slice + self.inner.request_timeout;
        // Dropped while queued, or its answer lost, the wait's session is
        // ended, so that it is not granted the lock for a client that is
        // gone.
        let done = self
            .grant_on(&mut conn, (name, opts), owner, Some(ms), by)
            .await?;
        match done {
            Ok(rows) => match Self::answer(&rows, name, opts.get_mode()) {
                Ok(Some(mark)) => self.granted((name, opts), owner, conn, mark).map(Some),
                Ok(None) => Err(Error::malformed(NAME, "acquire", "a wait refused")),
                Err(conflict @ Error::ModeConflict { .. }) => {
                    // It holds nothing: fit for the next.
                    self.give_back(conn);
                    Err(conflict)
                }
                Err(e) => Err(e),
            },
            // Out of time, nothing granted as far as the error says; but a
            // grant racing the timeout is kept by the server, and a session
            // lock outlives its statement: the connection is closed (it
            // holds nothing else), never reused.
            Err(Failure {
                code: Some(code), ..
            }) if code == LOCK_NOT_AVAILABLE || code == QUERY_CANCELED => Ok(None),
            Err(f) => Err(f.error),
        }
    }
}
