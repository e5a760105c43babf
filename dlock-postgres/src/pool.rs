//! The driver's own connection pool.
//!
//! Every statement here is one round trip: a connection goes back to the
//! pool only after its statement finished, is closed otherwise (a
//! statement may still be in flight on it), and is checked with a ping
//! only after it sat idle long enough that the server, or a PgBouncer in
//! between, may have dropped it.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::Result;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgQueryResult, PgRow};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout_at};

use crate::backend::PgBackend;
use crate::error::{answered, sql_error, timed_out};

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
    options: PgConnectOptions,
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    slots: Semaphore,
    connect_timeout: Duration,
}

impl Pool {
    pub fn new(options: PgConnectOptions, max: u32, connect_timeout: Duration) -> Self {
        Pool {
            options,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(usize::try_from(max).unwrap_or(usize::MAX)),
            connect_timeout,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(PgConnection, Instant)>> {
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
            let Some((mut conn, since)) = idle else { break };
            if since.elapsed() < CHECK_AFTER_IDLE {
                return Ok(Lent::new(self, conn, permit));
            }
            if let Ok(Ok(())) = timeout_at(by, conn.ping()).await {
                return Ok(Lent::new(self, conn, permit));
            }
        }
        let by = by.min(Instant::now() + self.connect_timeout);
        match timeout_at(by, PgConnection::connect_with(&self.options)).await {
            Ok(Ok(conn)) => Ok(Lent::new(self, conn, permit)),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }
}

/// A connection lent to one call. It goes back to the pool only through
/// [`Lent::give_back`]; dropped otherwise (a timeout, a dropped future, a
/// broken link), it is closed.
pub(crate) struct Lent<'a> {
    pool: &'a Pool,
    conn: Option<PgConnection>,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    fn new(pool: &'a Pool, conn: PgConnection, permit: SemaphorePermit<'a>) -> Self {
        Lent {
            pool,
            conn: Some(conn),
            _permit: permit,
        }
    }

    pub fn conn(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a lent connection is present until given back"),
        }
    }

    /// The statement finished: the connection is fit for the next one.
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle().push((conn, Instant::now()));
        }
    }
}

/// A statement's outcome. A reply (an error answer included) gives the
/// connection back to the pool; no reply in time, or a broken connection,
/// closes it.
pub(crate) fn settle<T>(
    lent: Lent<'_>,
    done: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    limit: Duration,
    doing: &str,
) -> Result<T> {
    let fit = match &done {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => answered(e),
        Err(_) => false,
    };
    if fit {
        lent.give_back();
    }
    match done {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(sql_error(e, doing)),
        Err(_) => Err(timed_out(format!("{doing}: no reply within {limit:?}"))),
    }
}

impl PgBackend {
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

    /// Runs one statement that changes rows, by `by`.
    pub(crate) async fn execute(
        &self,
        sql: sqlx::SqlStr,
        doing: &str,
        by: Instant,
    ) -> Result<PgQueryResult> {
        let mut lent = self.lend(doing, by).await?;
        let done = timeout_at(by, sqlx::raw_sql(sql).execute(lent.conn())).await;
        settle(lent, done, self.inner.request_timeout, doing)
    }

    /// Runs one statement that returns rows, by `by`.
    pub(crate) async fn fetch(
        &self,
        sql: sqlx::SqlStr,
        doing: &str,
        by: Instant,
    ) -> Result<Vec<PgRow>> {
        let mut lent = self.lend(doing, by).await?;
        let done = timeout_at(by, sqlx::raw_sql(sql).fetch_all(lent.conn())).await;
        settle(lent, done, self.inner.request_timeout, doing)
    }
}
