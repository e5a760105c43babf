//! How the pool ([`dlock_sql::Pool`]) opens PostgreSQL connections, and
//! which failed statements leave one fit; and the backend's statement
//! helpers. A connection goes back to the pool only after its statement
//! finished, and is checked with a ping only after it sat idle long enough
//! that the server, or a PgBouncer in between, may have dropped it.

use dlock_core::{Error, Result};
use dlock_sql::Dialect;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgQueryResult, PgRow, Postgres};
use tokio::time::Instant;

use crate::backend::PgBackend;
use crate::error::{INSUFFICIENT_PRIVILEGE, answered, sql_error, sql_state, timed_out};

/// Where the pool connects.
#[derive(Debug)]
pub(crate) struct Pg(pub PgConnectOptions);

impl Dialect for Pg {
    type Db = Postgres;
    type Mark = ();

    async fn open(&self) -> Result<(PgConnection, ()), sqlx::Error> {
        Ok((PgConnection::connect_with(&self.0).await?, ()))
    }

    fn reusable(e: &sqlx::Error) -> bool {
        answered(e)
    }

    fn error(e: sqlx::Error, doing: &str) -> Error {
        sql_error(e, doing)
    }

    fn timed_out(message: String) -> Error {
        timed_out(message)
    }

    fn rows_matched(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    fn may_not_create(e: &sqlx::Error) -> bool {
        sql_state(e).as_deref() == Some(INSUFFICIENT_PRIVILEGE)
    }
}

pub(crate) type Pool = dlock_sql::Pool<Pg>;

impl PgBackend {
    /// Runs one statement that changes rows, by `by`.
    pub(crate) async fn execute(
        &self,
        sql: sqlx::SqlStr,
        doing: &str,
        by: Instant,
    ) -> Result<PgQueryResult> {
        self.inner.pool.execute(sqlx::raw_sql(sql), doing, by).await
    }

    /// Runs one statement that returns rows, by `by`.
    pub(crate) async fn fetch(
        &self,
        sql: sqlx::SqlStr,
        doing: &str,
        by: Instant,
    ) -> Result<Vec<PgRow>> {
        self.inner
            .pool
            .fetch_all(sqlx::raw_sql(sql), doing, by)
            .await
    }
}
