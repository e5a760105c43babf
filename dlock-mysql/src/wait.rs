//! Acquire's wait, on core's shared loop, for every kind of lock. With
//! wake-ups on, a waiter registers under its own key (see [`crate::wake`])
//! when a sleeper connection is free, and sleeps in the server until a
//! change that may let it in (from any process) wakes it; the others poll
//! with jittered backoff, woken by releases in this process.
//!
//! Waiters queue: a place in the name's queue (rows of the holds table)
//! decides who goes in, in the order the places were taken. A shared
//! kind's waiter takes its place at its first look. A mutex waiter takes
//! one only once registered, and its place counts only while it is: the
//! lock goes to the first place, and a first place whose waiter could not
//! hear the release (a poller, a process gone) would keep the lock free
//! until that waiter looked again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Backoff, Deadline, wait_for_lock_with_pause};
use dlock_core::{Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::MySqlBackend;
use crate::pool::Mark;
use crate::wake::Sleeper;

/// How long a queued waiter of a shared kind sleeps in the server when
/// the name is free but the acquire's rule does not let it in: a waiter
/// ahead of it is about to go in. A mutex waiter sleeps on then, as while
/// the lock is held: the first waiter goes in, and its release (or its
/// leaving) wakes the next.
const QUEUED_NAP: Duration = Duration::from_millis(50);

/// The key a waiter registers under: a change that may let it in wakes
/// it by this key (the SQL side computes it as
/// `CONCAT(name, X'00', owner)`).
pub(crate) fn waiter_key(name: &str, waiter: &str) -> String {
    format!("{name}\0{waiter}")
}

/// The registration a wait holds between its pauses. Behind a mutex only
/// so that the wait stays `Send`: one wait uses it, never two tasks, and
/// no lock is kept across an await.
type Registration = Mutex<Option<Sleeper>>;

impl MySqlBackend {
    /// Acquire's wait for `name` until `deadline`: looks, each queued from
    /// the moment the waiter may queue (see the module's documentation;
    /// not from a look made once the wait's time is up), and a place given
    /// up however the wait ends without a grant: before an error returns,
    /// and on a task of its own when the wait is dropped.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        let max_poll = self.inner.max_poll;
        let backoff = Backoff::new(Duration::from_millis(50).min(max_poll), max_poll);
        let mutex = opts.get_mode() == Mode::Exclusive;
        let waiter = OwnerToken::random()?.to_string();
        let in_flight: Arc<Mutex<Option<Mark>>> = Arc::default();
        let queued = Arc::new(AtomicBool::new(false));
        let mut leave = {
            let (backend, name, waiter) = (self.clone(), name.to_owned(), waiter.clone());
            let (in_flight, queued) = (in_flight.clone(), queued.clone());
            UndoOnDrop::new(async move {
                if !queued.load(Ordering::Relaxed) {
                    return;
                }
                // A look dropped on its way may still commit its place:
                // its connection ends first, so the place it wrote goes
                // with the others (a place written after its removal
                // would keep the queue behind a waiter that left).
                let mark = in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                // Background work: in the pool's turns (see `in_background`).
                let until = Instant::now() + backend.inner.request_timeout * 2;
                let left = backend.inner.pool.in_background(until, async {
                    if let Some(mark) = mark {
                        let by = backend.deadline();
                        if let Err(e) = backend.end_connection(&mark, by).await {
                            tracing::debug!(name, error = %e, "a dropped look's connection");
                        }
                    }
                    backend.abandon(&name, &waiter).await;
                    Ok(())
                });
                if let Err(e) = left.await {
                    tracing::debug!(name, error = %e, "a dropped wait did not leave the queue");
                }
            })
        };
        let key = waiter_key(name, &waiter);
        let registration = Registration::new(None);
        let waited = wait_for_lock_with_pause(
            name,
            deadline,
            Some(&self.inner.wakeups),
            backoff,
            || {
                let registered = registration
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some();
                let queue = queued.load(Ordering::Relaxed)
                    || (!deadline.is_past() && (registered || !mutex));
                let first = queue && !queued.swap(queue, Ordering::Relaxed);
                let enqueue = first && !mutex;
                let (waiter, in_flight) = (&waiter, &in_flight);
                async move {
                    // A shared kind's first look queues without the name's
                    // row lock: in a crowd most first looks are refused.
                    if enqueue
                        && let Some(refused) =
                            self.enqueue_shared(name, opts, waiter, in_flight).await?
                    {
                        return Ok(refused);
                    }
                    self.look(name, opts, if queue { waiter } else { "" }, in_flight)
                        .await
                }
            },
            |deadline| self.pause((name, &waiter, &key), deadline, &registration, mutex),
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
            tokio::spawn(sleeper.unregister(unregister, key, limit));
        }
        if waited.is_err() && queued.load(Ordering::Relaxed) {
            // Here, not on a task a process on its way out may never run.
            self.abandon(name, &waiter).await;
        }
        leave.disarm();
        waited
    }

    /// The pause of `waiter` (registered under `key`) after a look at
    /// `name` that did not get the lock: `false` for the
    /// shared loop's local sleep (no sleeper connection to be had). A
    /// mutex waiter that registers now looks again at once: that look
    /// queues it, and a release from then on wakes it (a release reads the
    /// first place's registration before it commits, so a sleep that read
    /// the lock just before that commit would not be woken). Otherwise it
    /// sleeps in the server (see [`Sleeper::sleep`]). A sleeper connection
    /// that broke takes the registration with it: the waiter looks again
    /// at once, and registers anew if it can.
    async fn pause(
        &self,
        (name, waiter, key): (&str, &str, &str),
        deadline: Deadline,
        registration: &Registration,
        mutex: bool,
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
                if mutex {
                    *registration.lock().unwrap_or_else(PoisonError::into_inner) = Some(sleeper);
                    return true;
                }
                sleeper
            }
        };
        let (sql, limit) = (&self.inner.sql, self.inner.request_timeout);
        let cap = deadline.cap(self.inner.max_poll);
        if sleeper
            .sleep(
                sql,
                (name, waiter),
                cap,
                if mutex { cap } else { QUEUED_NAP },
                limit,
            )
            .await
        {
            *registration.lock().unwrap_or_else(PoisonError::into_inner) = Some(sleeper);
        }
        true
    }

    /// Registers as the waiter of `key`: `None` when this backend's
    /// sleeper connections are all busy or not open yet, or wake-ups are
    /// off.
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
