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

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::Result;
use sqlx::Connection;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlQueryResult};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout};

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

#[derive(Debug)]
pub(crate) struct Pool {
    options: MySqlConnectOptions,
    idle: Mutex<Vec<(MySqlConnection, Instant)>>,
    slots: Semaphore,
    connect_timeout: Duration,
}

impl Pool {
    pub fn new(options: MySqlConnectOptions, max: u32, connect_timeout: Duration) -> Self {
        Pool {
            options,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(usize::try_from(max).unwrap_or(usize::MAX)),
            connect_timeout,
        }
    }

    /// A new connection outside the pool's count, within the connect timeout.
    pub async fn open(&self) -> Result<MySqlConnection, LendError> {
        match tokio::time::timeout(
            self.connect_timeout,
            MySqlConnection::connect_with(&self.options),
        )
        .await
        {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }

    /// Adds a connection opened elsewhere (the one `connect` checks with).
    pub fn put(&self, conn: MySqlConnection) {
        self.idle().push((conn, Instant::now()));
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(MySqlConnection, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection for one statement, within `within`.
    pub async fn lend(&self, within: Duration) -> Result<Lent<'_>, LendError> {
        let deadline = Instant::now() + within;
        let permit = match tokio::time::timeout_at(deadline, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return Err(LendError::TimedOut),
        };
        loop {
            // The newest idle connection first: the likeliest to be alive.
            let idle = self.idle().pop();
            let Some((mut conn, since)) = idle else { break };
            if since.elapsed() < CHECK_AFTER_IDLE {
                return Ok(Lent::new(self, conn, permit));
            }
            if let Ok(Ok(())) = tokio::time::timeout_at(deadline, conn.ping()).await {
                return Ok(Lent::new(self, conn, permit));
            }
        }
        let connect_by = deadline.min(Instant::now() + self.connect_timeout);
        match tokio::time::timeout_at(connect_by, MySqlConnection::connect_with(&self.options))
            .await
        {
            Ok(Ok(conn)) => Ok(Lent::new(self, conn, permit)),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }
}

/// A connection lent to one statement. It goes back to the pool only
/// through [`Lent::give_back`]; dropped otherwise (a timeout, a dropped
/// future, a broken link), it is closed, because a statement may still be
/// in flight on it.
pub(crate) struct Lent<'a> {
    pool: &'a Pool,
    conn: Option<MySqlConnection>,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    fn new(pool: &'a Pool, conn: MySqlConnection, permit: SemaphorePermit<'a>) -> Self {
        Lent {
            pool,
            conn: Some(conn),
            _permit: permit,
        }
    }

    pub fn conn(&mut self) -> &mut MySqlConnection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a lent connection is present until given back"),
        }
    }

    /// The statement finished: the connection is fit for the next one.
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put(conn);
        }
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
    match done {
        Ok(Ok(value)) => {
            lent.give_back();
            Ok(value)
        }
        Ok(Err(e)) if e.as_database_error().is_some() => {
            lent.give_back();
            Err(sql_error(e, doing))
        }
        Ok(Err(e)) => Err(sql_error(e, doing)),
        Err(_) => Err(timed_out(format!("{doing}: no reply within {limit:?}"))),
    }
}

impl MySqlBackend {
    /// A pooled connection, waited for no longer than the request timeout.
    pub(crate) async fn lend(&self, doing: &str) -> Result<Lent<'_>> {
        match self.inner.pool.lend(self.inner.request_timeout).await {
            Ok(lent) => Ok(lent),
            Err(LendError::Connect(e)) => Err(sql_error(e, doing)),
            Err(LendError::TimedOut) => Err(timed_out(format!(
                "{doing}: no connection within {:?}",
                self.inner.request_timeout
            ))),
        }
    }

    /// Runs one statement, prepared or written out in full (see
    /// [`Batch`](crate::sql::Batch)), on a lent connection.
    pub(crate) async fn execute<'q>(
        &self,
        query: impl sqlx::Execute<'q, MySql> + 'q,
        doing: &str,
    ) -> Result<MySqlQueryResult> {
        use sqlx::Executor;
        let limit = self.inner.request_timeout;
        let mut lent = self.lend(doing).await?;
        let done = timeout(limit, lent.conn().execute(query)).await;
        settle(lent, done, limit, doing)
    }
}
