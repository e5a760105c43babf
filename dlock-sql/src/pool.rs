//! The drivers' own connection pool.
//!
//! sqlx's pool pings every connection when it comes back, one more round
//! trip per statement, during which the connection cannot be lent again,
//! and it may return a connection whose statement was cut off. Every
//! statement here is one round trip: a connection goes back to the pool
//! only after its statement finished, is closed otherwise (a statement may
//! still be in flight on it), and is checked with a ping only after it sat
//! idle long enough that the server, or a proxy in between, may have
//! dropped it. [`Pool::settle`] decides a lent connection's fate from its
//! statement's outcome.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::undo::retry_for;
use dlock_core::{Error, Lease, Result};
use sqlx::{Connection, Database, Execute, Executor};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::error::Elapsed;
use tokio::time::{Instant, timeout, timeout_at};

use crate::lent::Lent;

/// Idle longer than this, a connection is pinged before it is lent.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(30);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the pool needs of a database: how to open a connection, which
/// failed statements leave it fit, and how its errors read.
pub trait Dialect: Send + Sync + 'static {
    /// sqlx's database.
    type Db: Database;
    /// What the driver keeps with each pooled connection (MySQL: how an
    /// undo finds the connection on the server; PostgreSQL: the statements
    /// it has prepared).
    type Mark: Clone + Send + Sync + 'static;

    /// Opens a connection for the pool; the pool bounds the call.
    fn open(
        &self,
    ) -> impl Future<Output = std::result::Result<(Conn<Self>, Self::Mark), sqlx::Error>> + Send;

    /// Whether a connection whose statement failed with `e` may serve the
    /// next one: the server answered, and the session goes on.
    fn reusable(e: &sqlx::Error) -> bool;

    /// `e`, met while `doing`, as a dlock error.
    fn error(e: sqlx::Error, doing: &str) -> Error;

    /// A request that got no answer in time, as a dlock error.
    fn timed_out(message: String) -> Error;

    /// How many rows a statement matched (sqlx has no trait for it).
    fn rows_matched(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// Whether a `CREATE` failed with `e` for want of the right to create.
    fn may_not_create(e: &sqlx::Error) -> bool;
}

/// The connection type of a [`Dialect`].
pub type Conn<D> = <<D as Dialect>::Db as Database>::Connection;

/// An idle connection, its mark, and since when it is idle.
type Idle<D> = (Conn<D>, <D as Dialect>::Mark, Instant);

/// Why a connection could not be lent.
#[derive(Debug)]
pub enum LendError {
    /// Every connection stayed lent until the deadline.
    Busy,
    /// Opening a connection took past the deadline or the connect timeout.
    TimedOut,
    /// Opening a connection failed.
    Connect(sqlx::Error),
}

/// The pool: at most `max` connections lent at once, each call bounded by
/// the request timeout, and at most half of them (or the one of a pool of
/// one) to background work (see [`Pool::in_background`]).
pub struct Pool<D: Dialect> {
    dialect: Arc<D>,
    idle: Arc<Mutex<Vec<Idle<D>>>>,
    slots: Semaphore,
    background: Arc<Semaphore>,
    max: usize,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl<D: Dialect> std::fmt::Debug for Pool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("free", &self.slots.available_permits())
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Pool<D> {
    /// A pool of up to `max` connections opened by `dialect`.
    pub fn new(dialect: D, max: u32, connect_timeout: Duration, request_timeout: Duration) -> Self {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        Pool {
            dialect: Arc::new(dialect),
            idle: Arc::new(Mutex::new(Vec::new())),
            slots: Semaphore::new(max),
            background: Arc::new(Semaphore::new((max / 2).max(1))),
            max,
            connect_timeout,
            request_timeout,
        }
    }

    /// What opens the connections.
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The bound of every call.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// When a call starting now must have returned: every public call is
    /// bounded by one request timeout, the wait for a connection included.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.request_timeout
    }

    /// Runs `work`, background work that calls the pool (undoing what a
    /// dropped call may have done, giving up a waiter's place, releasing
    /// for a dropped guard), once it
    /// has one of the turns that keep such work to half the connections
    /// (to the one connection of a pool of one). After a stall, every call
    /// it cut off leaves such work retrying, each try holding a connection
    /// up to a request timeout; with the whole pool theirs, the
    /// application's new calls found none for seconds after the server
    /// was back. Turns go in order of asking; one not had by `until` (the
    /// end of the work's retries) fails the work, as a busy pool would.
    /// Work that waits its turn is late, not lost: an undo of a grant that
    /// may have happened, late or given up, leaves that grant to its TTL.
    ///
    /// # Errors
    /// `work`'s, or no turn by `until`.
    pub async fn in_background<T>(
        &self,
        until: Instant,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let _turn = self.turn(until).await?;
        work.await
    }

    /// One of the turns of [`Pool::in_background`], kept until dropped:
    /// what a driver gives core for a dropped guard's release.
    ///
    /// # Errors
    /// No turn by `until`.
    pub async fn turn(&self, until: Instant) -> Result<OwnedSemaphorePermit> {
        match timeout_at(until, self.background.clone().acquire_owned()).await {
            Ok(Ok(turn)) => Ok(turn),
            _ => Err(D::timed_out(
                "background work: no turn before its retries ended".to_owned(),
            )),
        }
    }

    /// Runs `op` until it succeeds, for at most `within`, each try in a
    /// background turn ([`Pool::in_background`]): how the drivers undo,
    /// and give places up, in the background.
    pub async fn retry_in_background<T, F, Fut>(&self, within: Duration, mut op: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let until = Instant::now() + within;
        retry_for(within, || self.in_background(until, op())).await
    }

    /// How many background turns are taken now.
    fn in_background_now(&self) -> usize {
        (self.max / 2).max(1) - self.background.available_permits()
    }

    pub(crate) fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle<D>>> {
        lock(&self.idle)
    }

    /// A connection for one call, by `by`; a new one is opened within the
    /// connect timeout too. An opening the call's deadline cuts off goes
    /// on, within the connect timeout, and what it opens waits idle for the
    /// next call: a server that takes longer to accept than a call may
    /// wait (a loaded server; one back from a stall, with every
    /// connection of the pool closed) still lets the pool fill again,
    /// where each call's own opening, cut off in turn, would never finish.
    ///
    /// # Errors
    /// Why none could be lent.
    pub async fn checkout(&self, by: Instant) -> std::result::Result<Lent<'_, D>, LendError> {
        let permit = match timeout_at(by, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return Err(LendError::Busy),
        };
        loop {
            // The newest idle connection first: the likeliest to be alive.
            let idle = self.idle().pop();
            let Some((mut conn, mark, since)) = idle else {
                break;
            };
            if since.elapsed() < CHECK_AFTER_IDLE {
                return Ok(Lent::new(self, conn, mark, permit));
            }
            if let Ok(Ok(())) = timeout_at(by, conn.ping()).await {
                return Ok(Lent::new(self, conn, mark, permit));
            }
        }
        let dialect = self.dialect.clone();
        let connect_timeout = self.connect_timeout;
        let mut opening =
            tokio::spawn(async move { timeout(connect_timeout, dialect.open()).await });
        match timeout_at(by, &mut opening).await {
            Ok(Ok(Ok(Ok((conn, mark))))) => Ok(Lent::new(self, conn, mark, permit)),
            Ok(Ok(Ok(Err(e)))) => Err(LendError::Connect(e)),
            Ok(Ok(Err(_)) | Err(_)) => Err(LendError::TimedOut),
            Err(_) => {
                let (idle, max) = (self.idle.clone(), self.max);
                tokio::spawn(async move {
                    if let Ok(Ok(Ok((conn, mark)))) = opening.await {
                        let mut idle = lock(&idle);
                        if idle.len() < max {
                            idle.push((conn, mark, Instant::now()));
                        }
                    }
                });
                Err(LendError::TimedOut)
            }
        }
    }

    /// The first connection, opened as a backend is built, within the
    /// connect timeout: what is wrong ("connection refused", bad
    /// credentials) is reported then, not by a later statement.
    ///
    /// # Errors
    /// Why none could be opened, as a dlock error.
    pub async fn first(&self) -> Result<Lent<'_, D>> {
        match self.checkout(Instant::now() + self.connect_timeout).await {
            Ok(lent) => Ok(lent),
            Err(LendError::Connect(e)) => Err(D::error(e, "connect")),
            Err(LendError::Busy | LendError::TimedOut) => Err(D::timed_out(format!(
                "connect: no answer within {:?}",
                self.connect_timeout
            ))),
        }
    }

    /// A connection for a call doing `doing`, by its deadline `by`.
    ///
    /// # Errors
    /// Why none could be lent, as a dlock error.
    pub async fn lend(&self, doing: &str, by: Instant) -> Result<Lent<'_, D>> {
        match self.checkout(by).await {
            Ok(lent) => Ok(lent),
            Err(LendError::Connect(e)) => Err(D::error(e, doing)),
            // `by` is the call's own bound, which need not be one request
            // timeout from now (a retry, an undo's deadline).
            Err(LendError::Busy) => Err(D::timed_out(format!(
                "{doing}: all {} connections stayed lent until the call's deadline \
                 (request timeout {:?}; {} background turns taken: undoing, leaving \
                 queues, dropped guards' releases)",
                self.max,
                self.request_timeout,
                self.in_background_now()
            ))),
            Err(LendError::TimedOut) => Err(D::timed_out(format!(
                "{doing}: no connection opened by the call's deadline (request timeout \
                 {:?}, connect timeout {:?}; the server slow to accept: an opening cut \
                 off goes on, for the next call)",
                self.request_timeout, self.connect_timeout
            ))),
        }
    }

    /// A statement's reply, `done`, as the call's result.
    ///
    /// # Errors
    /// The statement's error, or no reply in time.
    pub fn answer<T>(
        &self,
        done: std::result::Result<std::result::Result<T, sqlx::Error>, Elapsed>,
        doing: &str,
    ) -> Result<T> {
        match done {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(D::error(e, doing)),
            Err(_) => Err(D::timed_out(format!(
                "{doing}: no reply within {:?}",
                self.request_timeout
            ))),
        }
    }

    /// A statement's outcome. A reply that leaves the connection fit (an
    /// error answer included, see [`Dialect::reusable`]) gives it back to
    /// the pool; no reply in time, or a broken connection, closes it.
    ///
    /// # Errors
    /// As [`Pool::answer`].
    pub fn settle<T>(
        &self,
        lent: Lent<'_, D>,
        done: std::result::Result<std::result::Result<T, sqlx::Error>, Elapsed>,
        doing: &str,
    ) -> Result<T> {
        let fit = match &done {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => D::reusable(e),
            Err(_) => false,
        };
        if fit {
            lent.give_back();
        }
        self.answer(done, doing)
    }

    /// Runs one statement on a lent connection, by `by`: prepared, or
    /// written out in full (`sqlx::raw_sql`), as the caller made it.
    ///
    /// # Errors
    /// As [`Pool::lend`] and [`Pool::answer`].
    pub async fn execute<'q, Q>(
        &self,
        query: Q,
        doing: &str,
        by: Instant,
    ) -> Result<<D::Db as Database>::QueryResult>
    where
        Q: Execute<'q, D::Db> + 'q,
        for<'c> &'c mut Conn<D>: Executor<'c, Database = D::Db>,
    {
        let mut lent = self.lend(doing, by).await?;
        let done = timeout_at(by, lent.conn().execute(query)).await;
        self.settle(lent, done, doing)
    }

    /// Runs a statement that changes the caller's own live row (an
    /// extension, a hold), within the request timeout: "not held" unless
    /// it matched one.
    ///
    /// # Errors
    /// [`Error::NotHeld`], and as [`Pool::execute`].
    pub async fn own_row<'q, Q>(&self, query: Q, lease: &Lease, doing: &str) -> Result<()>
    where
        Q: Execute<'q, D::Db> + 'q,
        for<'c> &'c mut Conn<D>: Executor<'c, Database = D::Db>,
    {
        let done = self.execute(query, doing, self.deadline()).await?;
        if D::rows_matched(&done) == 1 {
            Ok(())
        } else {
            Err(Error::not_held(lease.name()))
        }
    }

    /// Runs one statement that returns rows, by `by`.
    ///
    /// # Errors
    /// As [`Pool::execute`].
    pub async fn fetch_all<'q, Q>(
        &self,
        query: Q,
        doing: &str,
        by: Instant,
    ) -> Result<Vec<<D::Db as Database>::Row>>
    where
        Q: Execute<'q, D::Db> + 'q,
        for<'c> &'c mut Conn<D>: Executor<'c, Database = D::Db>,
    {
        let mut lent = self.lend(doing, by).await?;
        let done = timeout_at(by, lent.conn().fetch_all(query)).await;
        self.settle(lent, done, doing)
    }
}
