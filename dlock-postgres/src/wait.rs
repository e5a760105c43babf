//! Acquire's wait, on core's shared loop: jittered polls, cut short by a
//! release in this process and by the holder's expiry; with wake-ups on,
//! a place in the name's queue, so that a release wakes one waiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Attempt, Backoff, Deadline, wait_for_lock, wait_for_lock_as};
use dlock_core::{Lease, LockOptions, Mode, OwnerToken, Result};

use crate::backend::PgBackend;

impl PgBackend {
    /// Acquire's wait for `name` until `deadline`.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        if let Some(options) = &self.inner.listen {
            crate::notify::Listener::start(&self.inner, options);
        }
        let max_poll = self.inner.max_poll;
        let first = Duration::from_millis(50).min(max_poll);
        let backoff = Backoff::new(first, max_poll);
        if opts.get_mode() != Mode::Exclusive {
            // A shared kind's waiter whose backend hears releases is woken
            // by the changes that let it in (a release, a waiter ahead
            // leaving, an undo); it polls for what sends nothing (an expiry,
            // which it looks at just after anyway, the end of a delayed
            // release, a place ahead that lapsed), so its polls start a
            // fifth of the longest apart: each is a look under the name's
            // row lock, in every release's way.
            let backoff = if self.inner.listener.listening() {
                Backoff::new((max_poll / 5).max(first), max_poll)
            } else {
                backoff
            };
            return self.wait_shared(name, opts, deadline, backoff).await;
        }
        if self.inner.listen.is_none() || self.inner.listener.gave_up() {
            return wait_for_lock(name, deadline, Some(&self.inner.wakeups), backoff, || {
                self.attempt(name, opts)
            })
            .await;
        }
        self.wait_queued(name, opts, deadline, backoff).await
    }

    /// The mutex's wait with wake-ups on: after a first look that costs
    /// what an uncontended acquire costs, a place in the name's queue
    /// (kept by every later look, given up however the wait ends without
    /// a grant). A release announces the first place only, so one waiter
    /// looks again, not every waiter of every process; the others keep
    /// polling, and take the lock if it is free when they look.
    async fn wait_queued(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
        backoff: Backoff,
    ) -> Result<Lease> {
        match self.attempt(name, opts).await {
            Ok(Attempt::Acquired(lease)) => return Ok(lease),
            Ok(Attempt::Held { .. }) => {}
            // The loop retries as it would have.
            Err(e) if e.is_retryable() => {
                tracing::debug!(name, error = %e, "attempt failed; trying again");
            }
            Err(e) => return Err(e),
        }
        let queued = |waiter: String| async move {
            // A waiter whose backend does not hear releases now keeps out
            // of the queue (it would be a deaf head) and polls.
            let place = if self.inner.listener.listening() {
                waiter.as_str()
            } else {
                ""
            };
            self.attempt_as(name, opts, place).await
        };
        let leave = |backend: PgBackend, name: String, waiter: String| async move {
            backend.leave_queue(&name, &waiter).await;
        };
        self.wait_in_queue(name, deadline, backoff, queued, leave)
            .await
    }

    /// A wait in `name`'s queue under a new waiter token: `attempt(token)`
    /// looks, and `leave(backend, name, token)` gives the place up however
    /// the wait ends without a grant.
    pub(crate) async fn wait_in_queue<A, AF, L, LF>(
        &self,
        name: &str,
        deadline: Deadline,
        backoff: Backoff,
        mut attempt: A,
        leave: L,
    ) -> Result<Lease>
    where
        A: FnMut(String) -> AF,
        AF: Future<Output = Result<Attempt>>,
        L: FnOnce(PgBackend, String, String) -> LF,
        LF: Future<Output = ()> + Send + 'static,
    {
        let waiter = OwnerToken::random()?.to_string();
        // Only a wait that looked as a waiter has a place to give up.
        let looked = Arc::new(AtomicBool::new(false));
        let mut leave = {
            let (looked, left) = (
                looked.clone(),
                leave(self.clone(), name.to_owned(), waiter.clone()),
            );
            UndoOnDrop::new(async move {
                if looked.load(Ordering::Relaxed) {
                    left.await;
                }
            })
        };
        let wakeups = &self.inner.queued_wakeups;
        let lease = wait_for_lock_as(name, &waiter, deadline, wakeups, backoff, || {
            looked.store(true, Ordering::Relaxed);
            attempt(waiter.clone())
        })
        .await?;
        leave.disarm();
        Ok(lease)
    }

    /// Gives a mutex waiter's place up, for good: a look still on its way
    /// when the wait ended cannot write the place anew (see
    /// `Statements::tombstone`). A release that named this waiter, which
    /// left without the lock, wakes nobody else: they find the lock free at
    /// their next poll.
    async fn leave_queue(&self, name: &str, waiter: &str) {
        let left = self
            .inner
            .pool
            .retry_in_background(self.inner.request_timeout * 2, || async {
                let sql = self.inner.sql.leave(name.as_bytes(), waiter);
                self.execute(sql, "leave the queue", self.deadline()).await
            })
            .await;
        tracing::debug!(name, ?left, "left the queue");
    }
}
