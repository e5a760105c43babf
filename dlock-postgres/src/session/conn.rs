//! Holding connections: how one is opened, runs a statement, and is
//! watched while it holds.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use dlock_core::{CancellationToken, Error, Lease, Mode, OwnerToken, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
use sqlx::{Connection, Row};
use tokio::time::{Instant, timeout, timeout_at};

use super::Inner;
use crate::backend::NAME;
use crate::error::{answered, sql_error, sql_state, timed_out};

/// Opens a connection within `bound`.
pub(super) async fn open(
    options: &PgConnectOptions,
    bound: std::time::Duration,
    doing: &str,
) -> Result<PgConnection> {
    match timeout(bound, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(sql_error(e, doing)),
        Err(_) => Err(timed_out(format!(
            "{doing}: no connection within the connect timeout ({bound:?})"
        ))),
    }
}

/// A statement that failed: after it the connection's holds are
/// unknown, and the caller closes it.
#[derive(Debug)]
pub(super) struct Failure {
    pub error: Error,
    /// The server ended the session: whatever it held is free.
    pub ended: bool,
    /// The server's SQLSTATE, when it answered.
    pub code: Option<String>,
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Self {
        f.error
    }
}

/// Runs `sql` (one simple query) on `conn`, answered by `by`.
pub(super) async fn run(
    conn: &mut PgConnection,
    sql: &str,
    by: Instant,
    doing: &str,
) -> std::result::Result<Vec<PgRow>, Failure> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match timeout_at(by, sqlx::raw_sql(sql).fetch_all(conn)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(Failure {
            code: sql_state(&e),
            ended: e.as_database_error().is_some() && !answered(&e),
            error: sql_error(e, doing),
        }),
        Err(_) => Err(Failure {
            error: timed_out(format!("{doing}: no answer within the request timeout")),
            ended: false,
            code: None,
        }),
    }
}

/// The connection's server session.
pub(super) async fn pid(conn: &mut PgConnection, by: Instant) -> Result<i32> {
    let rows = run(conn, "SELECT pg_backend_pid()", by, "probe").await?;
    let row = rows
        .last()
        .ok_or_else(|| Error::malformed(NAME, "probe", "no row"))?;
    read(row, 0)
}

/// Column `i` of `row`.
pub(super) fn read<T>(row: &PgRow, i: usize) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| Error::backend(NAME, "decode", e))
}

/// One hold of a session.
#[derive(Debug)]
pub(super) struct Held {
    pub owner: OwnerToken,
    pub name: String,
    pub mode: Mode,
    /// The `application_name` its grant set.
    pub mark: String,
}

/// A connection while it holds: its server session's holds live and die
/// with it.
#[derive(Debug)]
pub(super) struct Session {
    /// `None` once given back or closed.
    pub conn: tokio::sync::Mutex<Option<PgConnection>>,
    /// The server session that granted the holds.
    pub pid: i32,
    /// Cancelled when the session may have ended: the holds' `lost()`.
    pub lost: CancellationToken,
    holds: Mutex<Vec<Held>>,
}

impl Session {
    pub fn new(conn: PgConnection, pid: i32, first: Held) -> Arc<Self> {
        Arc::new(Session {
            conn: tokio::sync::Mutex::new(Some(conn)),
            pid,
            lost: CancellationToken::new(),
            holds: Mutex::new(vec![first]),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `lease` is one of this session's holds.
    pub fn holds(&self, lease: &Lease) -> bool {
        self.held()
            .iter()
            .any(|h| h.owner == lease.owner() && h.name == lease.name() && h.mode == lease.mode())
    }

    pub fn add(&self, hold: Held) {
        self.held().push(hold);
    }

    /// The mark of the hold that stays once `owner`'s is given up.
    pub fn mark_without(&self, owner: OwnerToken) -> Option<String> {
        self.held()
            .iter()
            .find(|h| h.owner != owner)
            .map(|h| h.mark.clone())
    }

    /// Forgets `owner`'s hold; the connection, when it holds nothing
    /// more.
    pub fn forget(
        &self,
        owner: OwnerToken,
        slot: &mut Option<PgConnection>,
    ) -> Option<PgConnection> {
        let mut held = self.held();
        held.retain(|h| h.owner != owner);
        if held.is_empty() { slot.take() } else { None }
    }

    /// Ends every hold: `lost()` fires, and the connection is closed.
    pub fn lose(&self, slot: &mut Option<PgConnection>) {
        self.lost.cancel();
        slot.take();
    }

    fn owners(&self) -> Vec<OwnerToken> {
        self.held().iter().map(|h| h.owner).collect()
    }
}

/// Probes `session` every `probe_every` while it holds: a probe that gets
/// no answer within the request timeout, or one from another server
/// session, ends its holds.
pub(super) fn watch(backend: Weak<Inner>, session: Arc<Session>) {
    let session = Arc::downgrade(&session);
    tokio::spawn(async move {
        loop {
            let Some(every) = backend
                .upgrade()
                .map(|b| (b.probe_every, b.request_timeout))
            else {
                return;
            };
            tokio::time::sleep(every.0).await;
            let Some(s) = session.upgrade() else { return };
            let mut slot = s.conn.lock().await;
            let Some(conn) = slot.as_mut() else { return };
            let by = Instant::now() + every.1;
            match pid(conn, by).await {
                Ok(pid) if pid == s.pid => continue,
                Ok(other) => tracing::warn!(
                    held = s.pid,
                    answered = other,
                    "a holding connection was answered by another server session (a pooler in transaction mode?): its holds end"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "a holding connection's probe failed: its holds end")
                }
            }
            s.lose(&mut slot);
            if let Some(b) = backend.upgrade() {
                let mut held = b.held.lock().unwrap_or_else(PoisonError::into_inner);
                for owner in s.owners() {
                    held.remove(&owner);
                }
            }
            return;
        }
    });
}
