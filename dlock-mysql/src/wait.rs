//! Acquire's wait, on core's shared loop. Its pause is MySQL's own: one
//! waiter per name registers (see [`crate::wake`]) and sleeps in the
//! server, where a release from any process wakes it; the others poll with
//! jittered backoff, woken by releases in this process, and take the
//! registration over when it frees.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::wait::{Attempt, Backoff, Deadline, wait_for_lock_with_pause};
use dlock_core::{Lease, LockOptions, Mode, Result};

use crate::backend::MySqlBackend;
use crate::wake::Sleeper;

/// How long a queued waiter of a shared kind sleeps in the server when the
/// name is free (see `pause`): a waiter ahead of it is about to go in.
const QUEUED_NAP: Duration = Duration::from_millis(50);

/// The key a queued waiter of a shared kind registers under: a change that
/// may let it in wakes it by this key (the SQL side computes it as
/// `CONCAT(name, X'00', owner)`).
pub(crate) fn waiter_key(name: &str, waiter: &str) -> String {
    format!("{name}\0{waiter}")
}

/// The registration a wait holds between its pauses. Behind a mutex only
/// so that the wait stays `Send`: one wait uses it, never two tasks, and
/// no lock is kept across an await.
type Registration = Mutex<Option<Sleeper>>;

impl MySqlBackend {
    /// Acquire's wait for `name` until `deadline`.
    pub(crate) async fn wait(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        let max_poll = self.inner.max_poll;
        let backoff = Backoff::new(Duration::from_millis(50).min(max_poll), max_poll);
        if opts.mode_value() != Mode::Exclusive {
            return self.wait_shared(name, opts, deadline, backoff).await;
        }
        self.wait_registered(name, name, deadline, backoff, || self.attempt(name, opts))
            .await
    }

    /// Core's wait loop for `name` with MySQL's pause: the waiter registers
    /// under `key` (the name, or for a queued waiter of a shared kind its
    /// [`waiter_key`], which the changes that may let it in wake), and
    /// unregisters once the wait ends.
    pub(crate) async fn wait_registered<F, Fut>(
        &self,
        key: &str,
        name: &str,
        deadline: Deadline,
        backoff: Backoff,
        attempt: F,
    ) -> Result<Lease>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt>>,
    {
        let registration = Registration::new(None);
        let waited = wait_for_lock_with_pause(
            name,
            deadline,
            Some(&self.inner.wakeups),
            backoff,
            attempt,
            |deadline| self.pause(key, name, deadline, &registration),
        )
        .await;
        let sleeper = registration
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(sleeper) = sleeper {
            // On a task of its own: a lease in hand must neither wait for
            // the unregister nor be lost if this future is dropped during it.
            let unregister = self.inner.sql.unregister.clone();
            let limit = self.inner.request_timeout;
            tokio::spawn(sleeper.unregister(unregister, key.to_owned(), limit));
        }
        waited
    }

    /// The pause after a look that did not get the lock: `false` for the
    /// shared loop's local sleep. A mutex waiter that registers now looks
    /// again at once (a release from then on wakes it); a queued waiter of
    /// a shared kind sleeps at once, as its sleep reads first whether it
    /// would be let in. Then it sleeps in the server until the holder's
    /// lease ends, a release wakes it, or the poll interval passes. A sleeper connection that broke takes the
    /// registration with it: the waiter looks again at once, and registers
    /// anew if it can.
    async fn pause(
        &self,
        key: &str,
        name: &str,
        deadline: Deadline,
        registration: &Registration,
    ) -> bool {
        let held = registration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut sleeper = match held {
            Some(sleeper) => sleeper,
            None => {
                let Some(sleeper) = self.register(key).await else {
                    return false;
                };
                if key == name {
                    *registration.lock().unwrap_or_else(PoisonError::into_inner) = Some(sleeper);
                    return true;
                }
                sleeper
            }
        };
        let (sql, limit) = (&self.inner.sql, self.inner.request_timeout);
        let cap = deadline.cap(self.inner.max_poll);
        // A free mutex row means the next look gets the lock. A free
        // marker row of a shared kind does not: a waiter behind a queued
        // writer, or past a semaphore's first N, is still refused, and
        // would look again at once, over and over, until the waiters ahead
        // are in. It naps instead (a release still wakes it).
        let queued = key
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('\0'))
            .map(|waiter| (waiter, QUEUED_NAP));
        if sleeper.sleep(sql, name, cap, queued, limit).await {
            *registration.lock().unwrap_or_else(PoisonError::into_inner) = Some(sleeper);
        }
        true
    }

    /// Registers as the waiter of `key`: `None` when another waiter is,
    /// or this backend's sleeper connections are all busy or not open yet.
    async fn register(&self, key: &str) -> Option<Sleeper> {
        if !self.inner.wake_ups {
            return None;
        }
        let sleepers = &self.inner.sleepers;
        if let Some(claim) = sleepers.open_claim() {
            // Opening a connection can take long on a busy server: not on
            // this waiter's path. It polls meanwhile.
            let backend = self.clone();
            tokio::spawn(async move {
                let inner = &backend.inner;
                claim
                    .open(&inner.pool, &inner.sql, inner.request_timeout)
                    .await;
            });
        }
        let (sql, limit) = (&self.inner.sql, self.inner.request_timeout);
        Sleeper::register(sleepers, sql, key, limit).await
    }
}
