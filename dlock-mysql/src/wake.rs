//! Wake-ups across processes. MySQL has no notifications, so a waiter
//! sleeps in the server instead: one waiter per name registers by taking a
//! named lock (`GET_LOCK`) on a connection of its own, then sleeps there
//! (`SELECT SLEEP(…)`) until the holder's lease ends. The release statement
//! reads the registered connection (`IS_USED_LOCK`) in the same statement,
//! and the releaser ends the sleep with `KILL QUERY`, sent on the same
//! connection as the release so that it reaches the same server. Other
//! waiters poll slowly, and take over the registration when it frees.
//!
//! These connections run nothing but the named lock and the sleep, so a
//! late kill can only cut a sleep short; they never go back to the pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::SqlStr;
use sqlx::mysql::MySqlConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::timeout;

use crate::sql::Statements;

/// How many waiters of one backend can be registered (and hold a
/// connection each) at once; the rest poll.
const MAX_SLEEPERS: usize = 4;

/// The connections waiters sleep on.
#[derive(Debug)]
pub(crate) struct Sleepers {
    idle: Mutex<Vec<MySqlConnection>>,
    slots: Arc<Semaphore>,
    /// A connection is being opened for the next waiter.
    opening: AtomicBool,
}

impl Sleepers {
    pub fn new() -> Self {
        Sleepers {
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(MAX_SLEEPERS)),
            opening: AtomicBool::new(false),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<MySqlConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free slot and an idle connection, if there are both.
    fn take(&self) -> Option<(OwnedSemaphorePermit, MySqlConnection)> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        let conn = self.idle().pop()?;
        Some((permit, conn))
    }

    /// A claim on opening a connection for the next registration (in the
    /// background, off a waiter's path): `None` when one is idle, all slots
    /// are taken, or another is on its way.
    pub fn open_claim(self: &Arc<Self>) -> Option<Opening> {
        if !self.idle().is_empty() || self.slots.available_permits() == 0 {
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
    /// The connection asked for, if it opened.
    pub fn opened(self, conn: Option<MySqlConnection>) {
        if let Some(conn) = conn {
            self.0.idle().push(conn);
        }
    }
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
    _permit: OwnedSemaphorePermit,
}

impl Sleeper {
    /// Registers for `name` on an idle sleeper connection: `None` when
    /// there is none free, or another waiter is registered.
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
                _permit: permit,
            });
        }
        sleepers.idle().push(conn);
        None
    }

    /// Sleeps until the holder's lease of `name` ends, a release wakes us,
    /// or `cap` passes; at once when the name is free. False when the
    /// connection broke (the registration is gone with it).
    pub async fn sleep(
        &mut self,
        sql: &Statements,
        name: &str,
        cap: Duration,
        limit: Duration,
    ) -> bool {
        let query = sqlx::query(sql.sleep.clone())
            .bind(cap.as_secs_f64())
            .bind(name.as_bytes());
        match timeout(cap + limit, query.fetch_optional(&mut self.conn)).await {
            Ok(Ok(_)) => true,
            // Cut short by a kill: the server says so, the link is fine.
            Ok(Err(e)) => e.as_database_error().is_some(),
            Err(_) => false,
        }
    }

    /// Ends the registration and keeps the connection for the next waiter.
    /// Owns everything it needs, so that it can run on a task of its own
    /// while the waiter goes on with its lease.
    pub async fn unregister(mut self, unregister: SqlStr, name: String, limit: Duration) {
        let query = sqlx::query(unregister).bind(name.into_bytes());
        if let Ok(Ok(_)) = timeout(limit, query.execute(&mut self.conn)).await {
            self.sleepers.idle().push(self.conn);
        }
    }
}
