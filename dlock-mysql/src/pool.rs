//! The driver's own connection pool.
//!
//! sqlx's pool pings every connection when it comes back, one more round
//! trip per statement, during which the connection cannot be lent again,
//! and it may return a connection whose statement was cut off. Every
//! statement here is one round trip: a connection goes back to the pool
//! only after its statement finished, is closed otherwise, and is checked
//! with a ping only after it sat idle long enough that the server may have
//! dropped it. [`settle`] decides a lent connection's fate from its
//! statement's outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{OwnerToken, Result};
use sqlx::Connection;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlQueryResult};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout_at};

use crate::backend::MySqlBackend;
use crate::error::{sql_error, timed_out};

/// Idle longer than this, a connection is pinged before it is lent.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(30);

/// Why a connection could not be lent.
#[derive(Debug)]
pub(crate) enum LendError {
    /// No connection was free or could be opened in time.
    TimedOut,
    /// Opening a connection failed.
    Connect(sqlx::Error),
}

/// How an undo finds the server's side of a pooled connection: a named
/// lock the connection takes when it opens and holds for its whole life,
/// and the id the server gave it then. The server releases the lock only
/// once the connection has ended, its last statement run or rolled back.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    /// `dlock-c:<random>:<n>`: unique, so nobody else ever holds it.
    pub lock: Arc<str>,
    /// `CONNECTION_ID()`, as the connection saw it.
    pub id: i64,
}

/// A connection of the pool, with its [`Mark`].
#[derive(Debug)]
struct Pooled {
    conn: MySqlConnection,
    mark: Mark,
}

#[derive(Debug)]
pub(crate) struct Pool {
    options: MySqlConnectOptions,
    idle: Mutex<Vec<(Pooled, Instant)>>,
    slots: Semaphore,
    connect_timeout: Duration,
    /// `dlock-c:<random>`, unique to the pool; each connection's mark adds
    /// `:<n>`, the count of connections opened before it.
    marks: String,
    opened: AtomicU64,
}

impl Pool {
    pub fn new(options: MySqlConnectOptions, max: u32, connect_timeout: Duration) -> Result<Self> {
        Ok(Pool {
            options,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(usize::try_from(max).unwrap_or(usize::MAX)),
            connect_timeout,
            marks: format!("dlock-c:{}", OwnerToken::random()?),
            opened: AtomicU64::new(0),
        })
    }

    /// A new connection outside the pool's count (for the waiters' sleeps,
    /// which need no mark), within the connect timeout.
    pub async fn open(&self) -> Result<MySqlConnection, LendError> {
        let by = Instant::now() + self.connect_timeout;
        match timeout_at(by, MySqlConnection::connect_with(&self.options)).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }

    /// A new connection for the pool, marked, by `by` and within the
    /// connect timeout.
    async fn open_marked(&self, by: Instant) -> Result<Pooled, LendError> {
        let by = by.min(Instant::now() + self.connect_timeout);
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let lock: Arc<str> = format!("{}:{n}", self.marks).into();
        let marked = async {
            let mut conn = MySqlConnection::connect_with(&self.options).await?;
            // Signed both here and in the undo's read: servers differ in
            // which of the two they call unsigned.
            let (id, _): (i64, Option<i64>) =
                sqlx::query_as("SELECT CAST(CONNECTION_ID() AS SIGNED), GET_LOCK(?, 0)")
                    .bind(&*lock)
                    .fetch_one(&mut conn)
                    .await?;
            Ok::<_, sqlx::Error>(Pooled {
                conn,
                mark: Mark { lock, id },
            })
        };
        match timeout_at(by, marked).await {
            Ok(Ok(pooled)) => Ok(pooled),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(Pooled, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection for one call, by `by`.
    pub async fn lend(&self, by: Instant) -> Result<Lent<'_>, LendError> {
        let permit = match timeout_at(by, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return Err(LendError::TimedOut),
        };
        loop {
            // The newest idle connection first: the likeliest to be alive.
            let idle = self.idle().pop();
            let Some((mut pooled, since)) = idle else {
                break;
            };
            if since.elapsed() < CHECK_AFTER_IDLE {
                return Ok(Lent::new(self, pooled, permit));
            }
            if let Ok(Ok(())) = timeout_at(by, pooled.conn.ping()).await {
                return Ok(Lent::new(self, pooled, permit));
            }
        }
        let pooled = self.open_marked(by).await?;
        Ok(Lent::new(self, pooled, permit))
    }
}

/// A connection lent to one call. It goes back to the pool only through
/// [`Lent::give_back`]; dropped otherwise (a timeout, a dropped future, a
/// broken link), it is closed, because a statement may still be in flight
/// on it.
pub(crate) struct Lent<'a> {
    pool: &'a Pool,
    pooled: Option<Pooled>,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    fn new(pool: &'a Pool, pooled: Pooled, permit: SemaphorePermit<'a>) -> Self {
        Lent {
            pool,
            pooled: Some(pooled),
            _permit: permit,
        }
    }

    fn pooled(&mut self) -> &mut Pooled {
        match &mut self.pooled {
            Some(pooled) => pooled,
            None => unreachable!("a lent connection is present until given back"),
        }
    }

    pub fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.pooled().conn
    }

    /// The connection's [`Mark`], for an undo of what is sent on it.
    pub fn mark(&mut self) -> Mark {
        self.pooled().mark.clone()
    }

    /// The statement finished: the connection is fit for the next one.
    pub fn give_back(mut self) {
        if let Some(pooled) = self.pooled.take() {
            self.pool.idle().push((pooled, Instant::now()));
        }
    }
}

/// A statement's reply, `done`, as the call's result.
pub(crate) fn answer<T>(
    done: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    limit: Duration,
    doing: &str,
) -> Result<T> {
    match done {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(sql_error(e, doing)),
        Err(_) => Err(timed_out(format!("{doing}: no reply within {limit:?}"))),
    }
}

/// A statement's outcome. A reply (an error answer included) gives the
/// connection back to the pool; no reply in time, or a broken connection,
/// closes it: a statement may still be in flight on it.
pub(crate) fn settle<T>(
    lent: Lent<'_>,
    done: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    limit: Duration,
    doing: &str,
) -> Result<T> {
    let answered = match &done {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => e.as_database_error().is_some(),
        Err(_) => false,
    };
    if answered {
        lent.give_back();
    }
    answer(done, limit, doing)
}

impl MySqlBackend {
    /// When a call starting now must have returned: every public call is
    /// bounded by one request timeout, the wait for a connection included.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout
    }

    /// A pooled connection, by the call's deadline `by`.
    pub(crate) async fn lend(&self, doing: &str, by: Instant) -> Result<Lent<'_>> {
        match self.inner.pool.lend(by).await {
            Ok(lent) => Ok(lent),
            Err(LendError::Connect(e)) => Err(sql_error(e, doing)),
            Err(LendError::TimedOut) => Err(timed_out(format!(
                "{doing}: no connection within {:?}",
                self.inner.request_timeout
            ))),
        }
    }

    /// Runs one statement, prepared or written out in full (see
    /// [`Batch`](crate::sql::Batch)), on a lent connection, by `by`.
    pub(crate) async fn execute<'q>(
        &self,
        query: impl sqlx::Execute<'q, MySql> + 'q,
        doing: &str,
        by: Instant,
    ) -> Result<MySqlQueryResult> {
        use sqlx::Executor;
        let mut lent = self.lend(doing, by).await?;
        let done = timeout_at(by, lent.conn().execute(query)).await;
        settle(lent, done, self.inner.request_timeout, doing)
    }
}
