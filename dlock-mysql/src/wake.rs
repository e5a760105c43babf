//! Wake-ups across processes. MySQL has no notifications, so a waiter
//! sleeps in the server instead: one waiter per name registers by taking a
//! named lock (`GET_LOCK`) on a connection of its own, then sleeps there
//! (`SELECT SLEEP(…)`) until the holder's lease ends. The release statement
//! reads the registered connection (`IS_USED_LOCK`) in the same statement,
//! and the releaser ends the sleep with `KILL QUERY`. Other waiters poll
//! slowly, and take over the registration when it frees.
//!
//! These connections run nothing but the named lock and the sleep, so a
//! late kill can only cut a sleep short; they never go back to the pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::timeout;

use crate::sql::Statements;

/// How many waiters of one backend can be registered (and hold a
/// connection each) at once; the rest poll.
const MAX_SLEEPERS: usize = 4;

/// The connections waiters sleep on.
#[derive(Debug)]
pub(crate) struct Sleepers {
    idle: Mutex<Vec<MySqlConnection>>,
    slots: Semaphore,
    /// A connection is being opened for the next waiter.
    opening: AtomicBool,
}

impl Sleepers {
    pub fn new() -> Self {
        Sleepers {
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(MAX_SLEEPERS),
            opening: AtomicBool::new(false),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<MySqlConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free slot and an idle connection, if there are both.
    pub fn take(&self) -> Option<(SemaphorePermit<'_>, MySqlConnection)> {
        let permit = self.slots.try_acquire().ok()?;
        let conn = self.idle().pop()?;
        Some((permit, conn))
    }

    /// Whether a waiter should open a connection for the next registration
    /// (in the background, off its own wait): no idle one, and none on
    /// its way. A true answer must be followed by [`Sleepers::opened`].
    pub fn should_open(&self) -> bool {
        self.idle().is_empty()
            && self.slots.available_permits() > 0
            && !self.opening.swap(true, Ordering::AcqRel)
    }

    /// The connection asked for by [`Sleepers::should_open`], if it opened.
    pub fn opened(&self, conn: Option<MySqlConnection>) {
        if let Some(conn) = conn {
            self.idle().push(conn);
        }
        self.opening.store(false, Ordering::Release);
    }
}

/// A waiter registered for one name: it holds the name's named lock on its
/// connection. Dropped without [`Sleeper::unregister`], the connection is
/// closed, which ends the registration on the server.
pub(crate) struct Sleeper<'a> {
    sleepers: &'a Sleepers,
    conn: MySqlConnection,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Sleeper<'a> {
    /// Registers on `conn` for `name`; gives the connection back and
    /// returns `None` when another waiter is registered.
    pub async fn register(
        sleepers: &'a Sleepers,
        permit: SemaphorePermit<'a>,
        mut conn: MySqlConnection,
        sql: &Statements,
        name: &str,
        limit: Duration,
    ) -> Option<Sleeper<'a>> {
        let query = sqlx::query_scalar(sql.register.clone()).bind(name.as_bytes());
        let got: Option<i64> = timeout(limit, query.fetch_one(&mut conn))
            .await
            .ok()?
            .ok()?;
        if got == Some(1) {
            return Some(Sleeper {
                sleepers,
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
    pub async fn unregister(mut self, sql: &Statements, name: &str, limit: Duration) {
        let query = sqlx::query(sql.unregister.clone()).bind(name.as_bytes());
        if let Ok(Ok(_)) = timeout(limit, query.execute(&mut self.conn)).await {
            self.sleepers.idle().push(self.conn);
        }
    }
}
