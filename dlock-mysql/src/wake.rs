//! Wake-ups across processes. MySQL has no notifications, so a waiter
//! sleeps in the server instead: it registers by taking a named lock
//! (`GET_LOCK`, its key the name and its waiter token) on a connection of
//! its own, then sleeps there until the holder's lease ends, by waiting
//! for the backend's anchor (a named lock that one more connection of its
//! own holds, and never gives up). A change that may let queued waiters
//! in reads the connections they sleep on (`IS_USED_LOCK` of their keys;
//! a mutex's release in its own statement, for the first place only) and
//! ends their waits with `KILL QUERY`, sent on the same connection as the
//! change so that it reaches the same server. A waiter without a free
//! sleeper connection polls.
//!
//! These connections run nothing but the named locks and the wait, so a
//! late kill can only cut a wait short; they never go back to the pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::SqlStr;
use sqlx::mysql::MySqlConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout};

use crate::pool::Pool;
use crate::sql::Statements;

/// How many waiters of one backend can be registered (and hold a
/// connection each) at once; the rest poll.
const MAX_SLEEPERS: usize = 4;

/// How long after a failed connect no connection is opened for waiters.
const RETRY_OPEN_AFTER: Duration = Duration::from_secs(30);

/// The connections waiters sleep on.
#[derive(Debug)]
pub(crate) struct Sleepers {
    idle: Mutex<Vec<MySqlConnection>>,
    slots: Arc<Semaphore>,
    /// A connection is being opened for the next waiter.
    opening: AtomicBool,
    /// The named lock sleepers wait for, and the connection that holds it:
    /// while it lives, a wait ends only at its timeout or by a kill.
    anchor_name: String,
    anchor: Mutex<Option<MySqlConnection>>,
    /// The server cannot wait for a fraction of a second, or refuses named
    /// locks: waiters poll.
    unsupported: AtomicBool,
    /// No connection opens for waiters before this: the last try could not
    /// connect.
    retry_at: Mutex<Option<Instant>>,
}

impl Sleepers {
    pub fn new(anchor_name: String) -> Self {
        Sleepers {
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(MAX_SLEEPERS)),
            opening: AtomicBool::new(false),
            anchor_name,
            anchor: Mutex::new(None),
            unsupported: AtomicBool::new(false),
            retry_at: Mutex::new(None),
        }
    }

    /// The anchor's named lock, for [`crate::MySqlBackend`]'s test hook.
    #[cfg(feature = "_test-hooks")]
    pub fn anchor_name(&self) -> &str {
        &self.anchor_name
    }

    fn idle(&self) -> MutexGuard<'_, Vec<MySqlConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn retry_at(&self) -> MutexGuard<'_, Option<Instant>> {
        self.retry_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn anchor(&self) -> MutexGuard<'_, Option<MySqlConnection>> {
        self.anchor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free slot and an idle connection, if there are both and the
    /// anchor is held.
    fn take(&self) -> Option<(OwnedSemaphorePermit, MySqlConnection)> {
        if self.anchor().is_none() {
            return None;
        }
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        let conn = self.idle().pop()?;
        Some((permit, conn))
    }

    /// A claim on opening connections for the next registration (in the
    /// background, off a waiter's path): `None` when the anchor is held and
    /// a connection idle, all slots are taken, another opening is on its
    /// way, or the server cannot serve sleepers.
    pub fn open_claim(self: &Arc<Self>) -> Option<Opening> {
        let ready = self.anchor().is_some() && !self.idle().is_empty();
        let resting = self.retry_at().is_some_and(|at| Instant::now() < at);
        if ready
            || resting
            || self.slots.available_permits() == 0
            || self.unsupported.load(Ordering::Relaxed)
        {
            return None;
        }
        let claimed = !self.opening.swap(true, Ordering::AcqRel);
        claimed.then(|| Opening(self.clone()))
    }
}

/// The claim of [`Sleepers::open_claim`]; released when dropped, however
/// the opening task ends (a runtime shutting down included).
pub(crate) struct Opening(Arc<Sleepers>);

impl Opening {
    /// Opens the anchor if it is not held, then a connection for the next
    /// waiter. Gives up quietly on any failure, waiters polling meanwhile:
    /// for a while when the server could not be reached (at its connection
    /// limit, say), for good when it cannot serve sleepers.
    pub async fn open(self, pool: &Pool, sql: &Statements, limit: Duration) {
        let sleepers = &self.0;
        let rest = || *sleepers.retry_at() = Some(Instant::now() + RETRY_OPEN_AFTER);
        if sleepers.anchor().is_none() {
            let Ok(mut conn) = pool.dialect().open_unpooled().await else {
                return rest();
            };
            let query = sqlx::query_as::<_, (Option<i64>, Option<i64>, i64)>(sql.anchor.clone())
                .bind(&sleepers.anchor_name);
            match timeout(limit, query.fetch_one(&mut conn)).await {
                Ok(Ok((Some(1), Some(1), id))) => {
                    match direct(pool, sql, &sleepers.anchor_name, id, limit).await {
                        Some(true) => *sleepers.anchor() = Some(conn),
                        Some(false) => {
                            tracing::warn!(
                                "wake-ups: the pool's connections do not see the anchor's \
                             connection under its own id (a proxy between?); waiters poll"
                            );
                            sleepers.unsupported.store(true, Ordering::Relaxed);
                            return;
                        }
                        // No answer: the anchor goes with its connection, and
                        // the check is made again later.
                        None => return rest(),
                    }
                }
                // Not MariaDB, or named locks refused (Galera may): poll.
                Ok(Ok((_, Some(0), _)) | Err(sqlx::Error::Database(_))) => {
                    tracing::debug!("waiters poll: the server cannot let them sleep in it");
                    sleepers.unsupported.store(true, Ordering::Relaxed);
                    return;
                }
                // Held for a moment by a sleeper that won it from a lost
                // anchor (its connection is closing), or no answer: next time.
                _ => return,
            }
        }
        if !sleepers.idle().is_empty() {
            return;
        }
        match pool.dialect().open_unpooled().await {
            Ok(conn) => sleepers.idle().push(conn),
            Err(_) => rest(),
        }
    }
}

/// Whether a connection of the pool sees the anchor's named lock held by
/// the anchor's connection (`id`, as the server numbers it), as a release
/// must see a sleeper's to wake it. Not so behind a proxy that spreads
/// connections over servers or renumbers them: there a release would send
/// its `KILL QUERY` to a connection number that names another client's
/// connection, and waiters poll instead. `None` when the pool gives no
/// answer (busy, or the server slow): nothing is known.
async fn direct(
    pool: &Pool,
    sql: &Statements,
    anchor: &str,
    id: i64,
    limit: Duration,
) -> Option<bool> {
    let mut lent = pool.lend("wake-ups", Instant::now() + limit).await.ok()?;
    let query = sqlx::query_scalar::<_, Option<i64>>(sql.anchor_holder.clone()).bind(anchor);
    let holder = timeout(limit, query.fetch_one(lent.conn()))
        .await
        .ok()?
        .ok()?;
    lent.give_back();
    Some(holder == Some(id))
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.0.opening.store(false, Ordering::Release);
    }
}

/// A waiter registered for one name: it holds the name's named lock on its
/// connection. Dropped without [`Sleeper::unregister`], the connection is
/// closed, which ends the registration on the server.
pub(crate) struct Sleeper {
    sleepers: Arc<Sleepers>,
    conn: MySqlConnection,
    /// A sleep failed: the connection is in doubt (or holds the anchor),
    /// so it is closed rather than kept.
    broken: bool,
    _permit: OwnedSemaphorePermit,
}

impl Sleeper {
    /// Registers under `name` (a waiter's key) on an idle sleeper
    /// connection: `None` when there is none free, or the key is taken.
    pub async fn register(
        sleepers: &Arc<Sleepers>,
        sql: &Statements,
        name: &str,
        limit: Duration,
    ) -> Option<Sleeper> {
        let (permit, mut conn) = sleepers.take()?;
        let query = sqlx::query_scalar(sql.register.clone()).bind(name.as_bytes());
        let got: Option<i64> = timeout(limit, query.fetch_one(&mut conn))
            .await
            .ok()?
            .ok()?;
        if got == Some(1) {
            return Some(Sleeper {
                sleepers: sleepers.clone(),
                conn,
                broken: false,
                _permit: permit,
            });
        }
        sleepers.idle().push(conn);
        None
    }

    /// Sleeps until the holder's lease of `name` ends, a change that may
    /// let `waiter` in wakes us, or `cap` passes; not at all when the
    /// acquire's rule lets the waiter in now, and for `nap` when the name
    /// is free but the waiter is not let in (one ahead of it is about to
    /// go in). False when the connection broke (the registration is gone
    /// with it), or the anchor did (its connection is then opened again).
    pub async fn sleep(
        &mut self,
        sql: &Statements,
        (name, waiter): (&str, &str),
        cap: Duration,
        nap: Duration,
        limit: Duration,
    ) -> bool {
        let query = sqlx::query_scalar(sql.sleep.clone())
            .bind(&self.sleepers.anchor_name)
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .bind(waiter)
            .bind(cap.as_secs_f64())
            .bind(name.as_bytes())
            .bind(nap.min(cap).as_secs_f64());
        // All of the reply: a kill may end it with an error after the row.
        let fine = match timeout(cap + limit, query.fetch_all(&mut self.conn)).await {
            Ok(Ok(got)) if got.contains(&Some(1_i64)) => {
                // The wait got the anchor: its connection is gone. Ours is
                // closed (it holds the anchor now) and a new one takes over.
                self.sleepers.anchor().take();
                false
            }
            // Free, timed out, or cut short by a kill (NULL).
            Ok(Ok(_)) => true,
            // Cut short by a kill: the server says so, the link is fine.
            Ok(Err(e)) => e.as_database_error().is_some(),
            Err(_) => false,
        };
        self.broken |= !fine;
        fine
    }

    /// Ends the registration and keeps the connection for the next waiter.
    /// Owns everything it needs, so that it can run on a task of its own
    /// while the waiter goes on with its lease.
    pub async fn unregister(mut self, unregister: SqlStr, name: String, limit: Duration) {
        if self.broken {
            return;
        }
        let query = sqlx::query(unregister).bind(name.into_bytes());
        if let Ok(Ok(_)) = timeout(limit, query.execute(&mut self.conn)).await {
            self.sleepers.idle().push(self.conn);
        }
    }
}
