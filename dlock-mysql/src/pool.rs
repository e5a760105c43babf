//! The driver's own connection pool.
//!
//! sqlx's pool pings every connection when it comes back, one more round
//! trip per statement, during which the connection cannot be lent again,
//! and it may return a connection whose statement was cut off. Every
//! statement here is one round trip: a connection goes back to the pool
//! only after its statement finished, is closed otherwise, and is checked
//! with a ping only after it sat idle long enough that the server may have
//! dropped it.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

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
