//! Holding connections: how one is opened, runs a statement, and is
//! watched while it holds.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::{CancellationToken, Error, Lease, Mode, OwnerToken, Result};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgRow, Postgres};
use sqlx::{Arguments, Connection, Row};
use tokio::time::{Instant, timeout_at};

use super::Inner;
use crate::backend::NAME;
use crate::error::{answered, sql_error, sql_state, timed_out};

/// A connection, its server session, since when it is idle, and the
/// holder and name its session's row names (`None`: not known).
#[derive(Debug)]
pub(super) struct Conn {
    pub conn: PgConnection,
    pub pid: i32,
    pub idle_since: Instant,
    pub holder: Option<String>,
    pub name: Option<String>,
    /// Taken from the idle list for this call: it may have died there.
    pub reused: bool,
}

/// Opens a connection, connected within `bound` and by `by`, and runs
/// `setup` on it by `by` (its session's settings and row; it answers the
/// pid).
pub(super) async fn open(
    options: &PgConnectOptions,
    (bound, by): (Duration, Instant),
    setup: &str,
    doing: &str,
) -> Result<Conn> {
    let connected_by = by.min(Instant::now() + bound);
    let mut conn = match timeout_at(connected_by, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(sql_error(e, doing)),
        Err(_) => {
            return Err(timed_out(format!(
                "{doing}: no connection within the connect timeout ({bound:?}) or the call's bound"
            )));
        }
    };
    let sql = sqlx::AssertSqlSafe(setup.to_owned());
    let rows = outcome(
        timeout_at(by, sqlx::raw_sql(sql).fetch_all(&mut conn)).await,
        doing,
    )?;
    let row = rows
        .last()
        .ok_or_else(|| Error::malformed(NAME, doing, "no row"))?;
    Ok(Conn {
        conn,
        pid: read(row, 0)?,
        idle_since: Instant::now(),
        holder: None,
        name: None,
        reused: false,
    })
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

fn outcome<T>(
    done: std::result::Result<sqlx::Result<T>, tokio::time::error::Elapsed>,
    doing: &str,
) -> std::result::Result<T, Failure> {
    match done {
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

/// Runs a simple query (DDL) on `conn`, answered by `by`.
pub(super) async fn run(
    conn: &mut PgConnection,
    sql: &str,
    by: Instant,
    doing: &str,
) -> std::result::Result<Vec<PgRow>, Failure> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    outcome(
        timeout_at(by, sqlx::raw_sql(sql).fetch_all(conn)).await,
        doing,
    )
}

/// Runs the prepared statement `sql` with `args` on `conn`, answered by
/// `by`.
pub(super) async fn query(
    conn: &mut PgConnection,
    (sql, args): (sqlx::SqlStr, PgArguments),
    by: Instant,
    doing: &str,
) -> std::result::Result<Vec<PgRow>, Failure> {
    let query = sqlx::query_with::<Postgres, _>(sql, args);
    outcome(timeout_at(by, query.fetch_all(conn)).await, doing)
}

/// The arguments of a statement.
pub(super) fn args(
    add: impl FnOnce(&mut PgArguments) -> std::result::Result<(), sqlx::error::BoxDynError>,
) -> Result<PgArguments> {
    let mut args = PgArguments::default();
    add(&mut args).map_err(|e| Error::backend(NAME, "encode", sqlx::Error::Encode(e)))?;
    Ok(args)
}

/// Column `i` of `row`.
pub(super) fn read<T>(row: &PgRow, i: usize) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
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
    /// Its mark, as its grant set the session's `application_name`.
    pub mark: String,
    pub holder: String,
}

/// A connection while it holds: its server session's holds live and die
/// with it.
#[derive(Debug)]
pub(super) struct Session {
    /// `None` once given back, closed, or while a statement runs on it
    /// (the statement's future owns it then: dropped, it closes it).
    pub conn: tokio::sync::Mutex<Option<Conn>>,
    /// The server session that granted the holds.
    pub pid: i32,
    /// Cancelled when the session may have ended: the holds' `lost()`.
    pub lost: CancellationToken,
    holds: Mutex<Vec<Held>>,
}

impl Drop for Session {
    /// A session dropped holding (its backend dropped, say) closes its
    /// connection, which frees its locks: its holds are lost.
    fn drop(&mut self) {
        self.lost.cancel();
    }
}

impl Session {
    pub fn new(conn: Conn, first: Held) -> Arc<Self> {
        Arc::new(Session {
            pid: conn.pid,
            conn: tokio::sync::Mutex::new(Some(conn)),
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

    /// The mark and holder of `owner`'s hold.
    pub fn hold_of(&self, owner: OwnerToken) -> Option<(String, String)> {
        self.held()
            .iter()
            .find(|h| h.owner == owner)
            .map(|h| (h.mark.clone(), h.holder.clone()))
    }

    /// The mark and holder of the session's hold other than `owner`'s.
    pub fn other(&self, owner: OwnerToken) -> Option<(String, String)> {
        self.held()
            .iter()
            .find(|h| h.owner != owner)
            .map(|h| (h.mark.clone(), h.holder.clone()))
    }

    /// Forgets `owner`'s hold: whether the session holds nothing more.
    pub fn forget(&self, owner: OwnerToken) -> bool {
        let mut held = self.held();
        held.retain(|h| h.owner != owner);
        held.is_empty()
    }

    pub fn owners(&self) -> Vec<OwnerToken> {
        self.held().iter().map(|h| h.owner).collect()
    }
}

/// Probes every holding session every `probe_every`, until the backend
/// is dropped: a probe that gets no answer within the request timeout,
/// or one from another server session, ends its holds. A hold shorter
/// than a period costs no probe.
pub(super) fn watch(backend: Weak<Inner>) {
    tokio::spawn(async move {
        loop {
            let Some(every) = backend.upgrade().map(|b| b.probe_every) else {
                return;
            };
            tokio::time::sleep(every).await;
            let Some(b) = backend.upgrade() else { return };
            let mut sessions: Vec<Arc<Session>> = {
                let held = b.held.lock().unwrap_or_else(PoisonError::into_inner);
                held.values().cloned().collect()
            };
            sessions.sort_by_key(|s| Arc::as_ptr(s) as usize);
            sessions.dedup_by_key(|s| Arc::as_ptr(s) as usize);
            let mut probes = tokio::task::JoinSet::new();
            for s in sessions {
                probes.spawn(probe(Arc::downgrade(&b), s, b.request_timeout));
            }
            drop(b);
            while probes.join_next().await.is_some() {}
        }
    });
}

/// One probe of a holding session.
async fn probe(backend: Weak<Inner>, s: Arc<Session>, bound: Duration) {
    let mut slot = s.conn.lock().await;
    let Some(conn) = slot.as_mut() else { return };
    let by = Instant::now() + bound;
    let answer = query(
        &mut conn.conn,
        (
            sqlx::SqlStr::from_static("SELECT pg_backend_pid()"),
            PgArguments::default(),
        ),
        by,
        "probe",
    )
    .await;
    let pid = answer.map_err(Error::from).and_then(|rows| {
        rows.first()
            .map_or(Ok(None), |r| read::<i32>(r, 0).map(Some))
    });
    match pid {
        Ok(Some(pid)) if pid == s.pid => return,
        Ok(other) => {
            tracing::warn!(
                held = s.pid,
                answered = ?other,
                "a holding connection was answered by another server session (a pooler in \
                 transaction mode?): its holds end"
            );
            // The session that holds may serve other clients now: ended,
            // it frees what it holds.
            if let Ok(end) = args(|a| a.add(s.pid)) {
                let _ = query(
                    &mut conn.conn,
                    (
                        sqlx::SqlStr::from_static("SELECT pg_terminate_backend($1)"),
                        end,
                    ),
                    by,
                    "probe",
                )
                .await;
            }
        }
        Err(e) => tracing::warn!(error = %e, "a holding connection's probe failed: its holds end"),
    }
    s.lost.cancel();
    slot.take();
    if let Some(b) = backend.upgrade() {
        let mut held = b.held.lock().unwrap_or_else(PoisonError::into_inner);
        for owner in s.owners() {
            held.remove(&owner);
        }
    }
}
