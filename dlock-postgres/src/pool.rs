//! How the pool ([`dlock_sql::Pool`]) opens PostgreSQL connections, and
//! which failed statements leave one fit; and how a statement runs
//! ([`run`]), prepared where it may be. A connection goes back to the pool
//! only after its statement finished, and is checked with a ping only
//! after it sat idle long enough that the server, or a PgBouncer in
//! between, may have dropped it.

use std::collections::HashSet;

use dlock_core::{Error, Result};
use dlock_sql::{Dialect, Lent};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgQueryResult, PgRow, Postgres};
use tokio::time::{Instant, timeout_at};

use crate::backend::PgBackend;
use crate::error::{INSUFFICIENT_PRIVILEGE, answered, sql_error, sql_state, timed_out};
use crate::sql::{Id, Stmt};

/// No prepared statement of that name on the server's session.
const INVALID_SQL_STATEMENT_NAME: &str = "26000";
/// A prepared statement of that name is there already.
const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";

/// Where the pool connects.
#[derive(Debug)]
pub(crate) struct Pg(pub PgConnectOptions);

impl Dialect for Pg {
    type Db = Postgres;
    type Mark = Prepared;

    async fn open(&self) -> Result<(PgConnection, Prepared), sqlx::Error> {
        Ok((
            PgConnection::connect_with(&self.0).await?,
            Prepared::default(),
        ))
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

/// The statements a connection's session has prepared, as far as this
/// client knows: behind a pooler in transaction mode, each statement may
/// run on another server's session, which may lack one it has, or have one
/// it lacks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Prepared(HashSet<Id>);

/// Sends a simple query on a connection, for what the caller reads of it.
type Sender<T> = for<'c> fn(&'c mut PgConnection, sqlx::SqlStr) -> BoxFuture<'c, sqlx::Result<T>>;

type BoxFuture<'c, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// Runs `stmt` on `lent` with `send`. Its prepared parts are sent as
/// `EXECUTE`s, the `PREPARE`s of those the session lacks as far as this
/// connection knows in front. A session that lacks one after all answers
/// "does not exist", one that has one already "already exists", naming
/// it, and the query is sent again with that part in the other form.
/// Either error rolls back the parts that ran before it in the same
/// transaction (a row's lock, a release; for the one statement that prepares a part
/// after its commit, the commit stands, and is harmless to send again:
/// see `Statements::enqueue_shared`), but not the `PREPARE`s that ran,
/// which the next try counts as there. Behind a pooler in transaction
/// mode each try may land on another server session; after a few, or
/// when a "does not exist" names none of the statement's parts, the
/// statement is sent written out in full. A statement's name is a hash of its text, so
/// a session that has it has this statement.
async fn run<T>(lent: &mut Lent<'_, Pg>, stmt: &Stmt, send: Sender<T>) -> sqlx::Result<T> {
    let (conn, prepared) = lent.parts();
    let mut prepare: Vec<Id> = Vec::new();
    for (_, id) in &stmt.ids {
        if !prepared.0.contains(id) && !prepare.contains(id) {
            prepare.push(*id);
        }
    }
    for _ in 0..stmt.ids.len() + 2 {
        let Some(sql) = stmt.execute(&prepare) else {
            break;
        };
        let done = send(conn, sql).await;
        let done = ended(conn, stmt, done).await;
        let Err(e) = &done else {
            // The others were believed there, or ran before: only what
            // this try prepared is new.
            prepared.0.extend(prepare.drain(..));
            return done;
        };
        let named = named(e).and_then(|id| stmt.ids.iter().position(|(_, ours)| *ours == id));
        match (sql_state(e).as_deref(), named) {
            // An `EXECUTE` failed, so every `PREPARE` in front ran. A
            // session that lacks this part most likely lacks the parts
            // after it that were not just prepared: preparing those costs
            // at most an "already exists", before any row's lock.
            (Some(INVALID_SQL_STATEMENT_NAME), Some(at)) => {
                let ran = std::mem::take(&mut prepare);
                prepared.0.extend(&ran);
                for (_, id) in &stmt.ids[at..] {
                    if !ran.contains(id) && !prepare.contains(id) {
                        prepared.0.remove(id);
                        prepare.push(*id);
                    }
                }
            }
            // The `PREPARE`s in front of the one that failed ran; those
            // after it are taken as there too (a session that has one of
            // a call's statements most likely has them all), and a "does
            // not exist" corrects it.
            (Some(DUPLICATE_PREPARED_STATEMENT), _) => {
                prepared.0.extend(prepare.drain(..));
            }
            // Not ours to name: nothing of this statement is taken as
            // there any more.
            (Some(INVALID_SQL_STATEMENT_NAME), None) => {
                for (_, id) in &stmt.ids {
                    prepared.0.remove(id);
                }
                break;
            }
            _ => return done,
        }
    }
    let done = send(conn, stmt.written_out()).await;
    ended(conn, stmt, done).await
}

/// The prepared statement of ours an error names: `dlock_` and the hex
/// digits of its hash, however the server's language quotes it.
fn named(e: &sqlx::Error) -> Option<Id> {
    named_in(e.as_database_error()?.message())
}

fn named_in(message: &str) -> Option<Id> {
    let mut rest = message;
    while let Some(at) = rest.find("dlock_") {
        let hash = &rest[at + "dlock_".len()..];
        let mut id = Id::default();
        if let Some(hex) = hash.get(..2 * id.len())
            && hex::decode_to_slice(hex, &mut id).is_ok()
        {
            return Some(id);
        }
        rest = hash;
    }
    None
}

/// `done`, once a statement that opens a transaction block of its own has
/// had it ended: a failure inside leaves it open and aborted, and every
/// later statement of the session refused. A failure after the block
/// (where `ROLLBACK` warns that nothing is in progress) comes only with
/// an error.
async fn ended<T>(conn: &mut PgConnection, stmt: &Stmt, done: sqlx::Result<T>) -> sqlx::Result<T> {
    // A `PREPARE` that finds its statement there fails ahead of any
    // block.
    let ahead =
        matches!(&done, Err(e) if sql_state(e).as_deref() == Some(DUPLICATE_PREPARED_STATEMENT));
    if done.is_err() && !ahead && stmt.opens_block() {
        let rollback = sqlx::raw_sql(sqlx::AssertSqlSafe("ROLLBACK"));
        if let Err(e) = rollback.execute(&mut *conn).await {
            tracing::debug!(error = %e, "could not roll a failed block back");
        }
    }
    done
}

/// Runs `stmt` on `lent` for its rows.
pub(crate) async fn fetch_on(lent: &mut Lent<'_, Pg>, stmt: &Stmt) -> sqlx::Result<Vec<PgRow>> {
    if let Some(query) = stmt.bound() {
        let done = query.fetch_all(&mut *lent.parts().0).await;
        if !lost_statements(lent, &done).await {
            return done;
        }
    }
    run(lent, stmt, |conn, sql| sqlx::raw_sql(sql).fetch_all(conn)).await
}

/// Runs `stmt` on `lent` for what it changed.
pub(crate) async fn execute_on(
    lent: &mut Lent<'_, Pg>,
    stmt: &Stmt,
) -> sqlx::Result<PgQueryResult> {
    if let Some(query) = stmt.bound() {
        let done = query.execute(&mut *lent.parts().0).await;
        if !lost_statements(lent, &done).await {
            return done;
        }
    }
    run(lent, stmt, |conn, sql| {
        Box::pin(sqlx::raw_sql(sql).execute(conn))
    })
    .await
}

/// Whether a bound statement failed because the session lost the
/// statements sqlx prepared on it (a `DISCARD ALL`, a `DEALLOCATE` by
/// someone else): sqlx's cache of them is emptied, so that the next call
/// prepares again, and this one goes as a simple query. Nothing ran.
async fn lost_statements<T>(lent: &mut Lent<'_, Pg>, done: &sqlx::Result<T>) -> bool {
    let lost =
        matches!(done, Err(e) if sql_state(e).as_deref() == Some(INVALID_SQL_STATEMENT_NAME));
    if lost && let Err(e) = lent.parts().0.clear_cached_statements().await {
        tracing::debug!(error = %e, "could not empty the statement cache");
    }
    lost
}

impl PgBackend {
    /// Runs one statement that changes rows, by `by`.
    pub(crate) async fn execute(
        &self,
        sql: Stmt,
        doing: &str,
        by: Instant,
    ) -> Result<PgQueryResult> {
        let pool = &self.inner.pool;
        let mut lent = pool.lend(doing, by).await?;
        let done = timeout_at(by, execute_on(&mut lent, &sql)).await;
        pool.settle(lent, done, doing)
    }

    /// Runs one statement that returns rows, by `by`.
    pub(crate) async fn fetch(&self, sql: Stmt, doing: &str, by: Instant) -> Result<Vec<PgRow>> {
        let pool = &self.inner.pool;
        let mut lent = pool.lend(doing, by).await?;
        let done = timeout_at(by, fetch_on(&mut lent, &sql)).await;
        pool.settle(lent, done, doing)
    }

    /// Runs a statement that changes the caller's own live row (an
    /// extension, a hold), within the request timeout: "not held" unless
    /// it matched one.
    pub(crate) async fn own_row(
        &self,
        sql: Stmt,
        lease: &dlock_core::Lease,
        doing: &str,
    ) -> Result<()> {
        let done = self.execute(sql, doing, self.deadline()).await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::not_held(lease.name()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_an_error_names_is_read_in_any_language() {
        let hash = "00112233445566778899aabbccddeeff";
        let mut id = Id::default();
        hex::decode_to_slice(hash, &mut id).unwrap();
        for message in [
            format!("prepared statement \"dlock_{hash}\" does not exist"),
            format!("vorbereitete Anweisung »dlock_{hash}« existiert nicht"),
            format!("l'instruction préparée « dlock_{hash} » n'existe pas"),
            format!("dlock_table: prepared statement \"dlock_{hash}\" already exists"),
        ] {
            assert_eq!(named_in(&message), Some(id), "{message}");
        }
        assert_eq!(
            named_in("prepared statement \"dlock_00\" does not exist"),
            None
        );
        assert_eq!(
            named_in("prepared statement \"sqlx_s_1\" does not exist"),
            None
        );
    }
}
