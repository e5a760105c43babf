//! How the pool ([`dlock_sql::Pool`]) opens MySQL connections, each with
//! its [`Mark`]; and the backend's statement helpers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{Error, OwnerToken, Result};
use dlock_sql::{Dialect, LendError};
use sqlx::Connection;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlQueryResult};
use tokio::time::{Instant, timeout_at};

use crate::backend::MySqlBackend;
use crate::error::{ER_TABLEACCESS_DENIED, server_error_number, sql_error, timed_out};

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

/// Where the pool connects, and how it marks its connections.
#[derive(Debug)]
pub(crate) struct My {
    options: MySqlConnectOptions,
    connect_timeout: Duration,
    /// `dlock-c:<random>`, unique to the pool; each connection's mark adds
    /// `:<n>`, the count of connections opened before it.
    marks: String,
    opened: AtomicU64,
}

impl My {
    pub fn new(options: MySqlConnectOptions, connect_timeout: Duration) -> Result<Self> {
        Ok(My {
            options,
            connect_timeout,
            marks: format!("dlock-c:{}", OwnerToken::random()?),
            opened: AtomicU64::new(0),
        })
    }

    /// A new connection outside the pool's count (for the waiters' sleeps,
    /// which need no mark), within the connect timeout.
    pub async fn open_unpooled(&self) -> Result<MySqlConnection, LendError> {
        let by = Instant::now() + self.connect_timeout;
        match timeout_at(by, MySqlConnection::connect_with(&self.options)).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(LendError::Connect(e)),
            Err(_) => Err(LendError::TimedOut),
        }
    }
}

impl Dialect for My {
    type Db = MySql;
    type Mark = Mark;

    /// A new connection for the pool, marked.
    async fn open(&self) -> Result<(MySqlConnection, Mark), sqlx::Error> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let lock: Arc<str> = format!("{}:{n}", self.marks).into();
        let mut conn = MySqlConnection::connect_with(&self.options).await?;
        // Signed both here and in the undo's read: servers differ in which
        // of the two they call unsigned.
        let (id, _): (i64, Option<i64>) =
            sqlx::query_as("SELECT CAST(CONNECTION_ID() AS SIGNED), GET_LOCK(?, 0)")
                .bind(&*lock)
                .fetch_one(&mut conn)
                .await?;
        Ok((conn, Mark { lock, id }))
    }

    /// Any error answer: the server answered, and MySQL keeps the session.
    fn reusable(e: &sqlx::Error) -> bool {
        e.as_database_error().is_some()
    }

    fn error(e: sqlx::Error, doing: &str) -> Error {
        sql_error(e, doing)
    }

    fn timed_out(message: String) -> Error {
        timed_out(message)
    }

    /// sqlx sets CLIENT_FOUND_ROWS: rows matched, not rows changed.
    fn rows_matched(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    fn may_not_create(e: &sqlx::Error) -> bool {
        server_error_number(e) == Some(ER_TABLEACCESS_DENIED)
    }
}

pub(crate) type Pool = dlock_sql::Pool<My>;
pub(crate) type Lent<'a> = dlock_sql::Lent<'a, My>;

impl MySqlBackend {
    /// Runs one statement, prepared or written out in full (see
    /// [`Batch`](crate::sql::Batch)), on a lent connection, by `by`.
    pub(crate) async fn execute<'q>(
        &self,
        query: impl sqlx::Execute<'q, MySql> + 'q,
        doing: &str,
        by: Instant,
    ) -> Result<MySqlQueryResult> {
        self.inner.pool.execute(query, doing, by).await
    }
}
