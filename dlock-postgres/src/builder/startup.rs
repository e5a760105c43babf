//! The first connection: whether the statements' settings can be the
//! connections' sessions' own (startup options, read back), or each
//! transaction sets them; and whether the lock table counts its queue's
//! places.

use std::time::Duration;

use dlock_core::{Error, Result};
use dlock_sql::Lent;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Row};
use tokio::time::{Instant, timeout_at};

use super::PgBuilder;
use crate::backend::NAME;
use crate::pool::{Pg, Pool};
use crate::sql::Statements;

impl PgBuilder {
    pub(super) fn pool(&self, options: PgConnectOptions) -> Pool {
        Pool::new(
            Pg(options),
            self.s.max_connections,
            self.s.connect_timeout,
            self.s.request_timeout,
        )
    }

    /// The pool (with its first connection idle in it when the settings
    /// hold); and whether its
    /// connections have the statements' settings for their whole session
    /// (see [`Statements::per_session`]), given as startup options. A
    /// pooler that lends server sessions to many clients refuses startup
    /// options (PgBouncer: "unsupported startup parameter"), or drops them
    /// when told to ignore them: then, and with a server older than
    /// PostgreSQL 12 (no `plan_cache_mode`), every statement sets them for
    /// its own transaction.
    pub(super) async fn open_pool(
        &self,
        options: PgConnectOptions,
        sql: &Statements,
    ) -> Result<(Pool, bool)> {
        let tuned = self.pool(options.clone().options(sql.session_settings()));
        let has = match tuned.first().await {
            Ok(mut first) => {
                let check = AssertSqlSafe(sql.has_session_settings());
                let by = Instant::now() + self.s.request_timeout;
                let rows = timeout_at(by, sqlx::raw_sql(check).fetch_all(first.conn())).await;
                let rows = tuned.answer(rows, "connect")?;
                let has = match rows.first().map(|row| row.try_get::<bool, _>(0)) {
                    Some(Ok(has)) => has,
                    _ => return Err(Error::malformed(NAME, "connect", "no settings")),
                };
                first.give_back();
                has
            }
            // Refused by a pooler (PgBouncer: "unsupported startup
            // parameter", 08P01, or it closes the connection) or by an
            // older server (42704): the plain pool says whether the server
            // is there at all. Not after no answer: that would only wait
            // again.
            Err(e) if !unanswered(&e) => {
                tracing::info!(error = %e, "startup options refused: settings per transaction");
                false
            }
            Err(e) => return Err(e),
        };
        if has {
            return Ok((tuned, true));
        }
        tracing::info!("startup options not in effect: settings per transaction");
        // The caller's first connection opens it.
        Ok((self.pool(options), false))
    }
}

/// Whether the lock table has the count of places: a table made by an
/// older release lacks it until `migrate` gives it one; unknown counts as
/// lacking. A simple query: a named statement of sqlx's, behind a pooler,
/// would be on a server session that other clients use too. `first` goes
/// back to the pool, or is closed when no reply came in time.
pub(super) async fn counts_places(
    sql: &Statements,
    mut first: Lent<'_, Pg>,
    request_timeout: Duration,
) -> bool {
    let places = timeout_at(
        Instant::now() + request_timeout,
        sqlx::raw_sql(AssertSqlSafe(sql.has_places())).fetch_one(first.conn()),
    )
    .await;
    let counted = matches!(&places, Ok(Ok(row)) if row.try_get::<bool, _>(0).unwrap_or(false));
    if places.is_err() {
        // No reply in time: dropped, the connection is closed.
        drop(first);
    } else {
        first.give_back();
    }
    counted
}

/// Whether a connect failed for want of an answer in time.
fn unanswered(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        source = cause.source();
    }
    false
}
