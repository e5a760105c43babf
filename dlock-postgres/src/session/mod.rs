//! The session mode: holds are session advisory locks on connections
//! dedicated to holding, as sqlx's `PgAdvisoryLock` takes them, with
//! dlock's API and guarantees (fencing tokens, `lost()`, reader-writer
//! locks, waits queued by the server).

mod conn;
mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::Deadline;
use dlock_core::{
    Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, Mode, OwnerToken, Result,
};
use sqlx::Arguments;
use sqlx::postgres::{PgConnectOptions, PgRow};
use tokio::time::Instant;

use self::conn::{Conn, Failure, Held, Session, args, query, read};
use self::sql::{SessionSql, fence_of, info, key, kind_of, mark_prefix};
use crate::backend::NAME;

// SQLSTATEs of a creation that raced another.
const UNIQUE_VIOLATION: &str = "23505";
const DUPLICATE_TABLE: &str = "42P07";

// SQLSTATEs of a wait that ran out of time.
const LOCK_NOT_AVAILABLE: &str = "55P03";
const QUERY_CANCELED: &str = "57014";

/// The longest one wait statement queues: an unbounded wait is a series
/// of these, so that a link gone silent under it is noticed.
const WAIT_SLICE: Duration = Duration::from_secs(30);

/// A PostgreSQL lock backend over session advisory locks: what sqlx's
/// `PgAdvisoryLock` does, with fencing tokens, `lost()`, reader-writer
/// locks and waits the server queues. Made by
/// [`PgBuilder::connect_session`](crate::PgBuilder::connect_session) or a
/// URL with `?mode=session`. Cheap to clone; clones share the
/// connections.
///
/// A hold lives as long as its connection's server session, as a
/// ZooKeeper session's nodes do: no TTL, nothing to renew. Each hold has a
/// connection of its own, probed every `max_poll_interval`; a probe
/// unanswered within the request timeout, or answered by another server
/// session, ends the hold: the guard's `lost()` fires and the connection
/// is closed. The server ends a session silent for twice that
/// (`idle_session_timeout`), so a holder paused or cut off loses its
/// lock, after its own probe has failed; a connection closed on the way
/// frees it at once, before the holder's next probe (see
/// [`Capabilities::freed_on_disconnect`]: fence what you write). It needs
/// connections that keep their server session: PostgreSQL itself, or
/// PgBouncer in session mode; a pooler in transaction mode is refused.
///
/// Names map to 64-bit advisory-lock keys (a hash): two names of one key
/// contend as one lock (false contention, never a false grant), and so
/// does an application's own advisory lock of that key. No semaphores and
/// no `list` (the server keeps keys, not names); `holders` and
/// `force_release` (which ends the holder's session) work by name.
#[derive(Clone)]
pub struct PgSessionBackend {
    inner: Arc<Inner>,
}

/// What the clones of one backend share.
#[derive(Debug)]
struct Inner {
    options: PgConnectOptions,
    sql: SessionSql,
    /// Connections that hold nothing, for the next call.
    idle: Mutex<Vec<Conn>>,
    max_idle: usize,
    /// The holding connections, by the owner token of each hold.
    held: Mutex<HashMap<OwnerToken, Arc<Session>>>,
    probe_every: Duration,
    /// The server ends a session silent this long.
    silence: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
}

impl std::fmt::Debug for PgSessionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSessionBackend")
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What a connect needs from the builder.
pub(crate) struct Setup {
    pub options: PgConnectOptions,
    pub schema: String,
    pub table: String,
    pub create: bool,
    pub max_idle: u32,
    pub probe_every: Duration,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
}

impl PgSessionBackend {
    /// Connects with default settings; the URL's query may set them as
    /// [`PgBackend::builder`](crate::PgBackend::builder) says.
    pub async fn connect(url: &str) -> Result<Self> {
        crate::PgBackend::builder(url).connect_session().await
    }

    pub(crate) async fn open(setup: Setup) -> Result<Self> {
        let backend = PgSessionBackend {
            inner: Arc::new(Inner {
                options: setup.options,
                sql: SessionSql::new(&setup.schema, &setup.table),
                idle: Mutex::default(),
                max_idle: usize::try_from(setup.max_idle).unwrap_or(usize::MAX),
                held: Mutex::default(),
                probe_every: setup.probe_every,
                // Twice what a holder takes to learn that its probes go
                // unanswered.
                silence: (setup.probe_every + setup.request_timeout) * 2,
                request_timeout: setup.request_timeout,
                connect_timeout: setup.connect_timeout,
            }),
        };
        let by = backend.deadline();
        if setup.create {
            backend.create(by).await?;
        }
        // Two connections served by one server session are a pooler in
        // transaction mode: a lock would stay with a session that serves
        // other clients. (Each statement also names its session.)
        let first = backend.connection("connect").await?;
        let second = backend.connection("connect").await?;
        if first.pid == second.pid {
            return Err(Error::invalid_option(
                "mode",
                "the session mode needs connections that keep their server session, and two \
                 connections were served by one (a pooler in transaction mode, such as \
                 PgBouncer's): connect to PostgreSQL itself or to a pooler in session mode, \
                 or use the lease table (the default mode)",
            ));
        }
        backend.give_back(first);
        backend.give_back(second);
        conn::watch(Arc::downgrade(&backend.inner));
        Ok(backend)
    }

    /// Creates the sequence and the holders' table when missing.
    async fn create(&self, by: Instant) -> Result<()> {
        let bound = (self.inner.connect_timeout, by);
        let create = self.inner.sql.create();
        for last in [false, true] {
            let mut conn = conn::open(&self.inner.options, bound, "SELECT 1", "connect").await?;
            match conn::run(&mut conn.conn, &create, by, "connect").await {
                Ok(_) => return Ok(()),
                // Another client created them at the same moment (`IF NOT
                // EXISTS` does not serialize creators): they are there.
                Err(f)
                    if !last
                        && matches!(
                            f.code.as_deref(),
                            Some(UNIQUE_VIOLATION | DUPLICATE_TABLE)
                        ) => {}
                Err(f) => return Err(f.error),
            }
        }
        Ok(())
    }

    /// The request timeout in milliseconds.
    fn ms(&self) -> i64 {
        i64::try_from(self.inner.request_timeout.as_millis()).unwrap_or(i64::MAX)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout
    }

    /// An idle connection the server has not ended for its silence, or a
    /// new one within the connect timeout.
    async fn connection(&self, doing: &str) -> Result<Conn> {
        let idle = {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            idle.retain(|c| c.idle_since.elapsed() < self.inner.silence / 2);
            idle.pop()
        };
        if let Some(mut conn) = idle {
            conn.reused = true;
            return Ok(conn);
        }
        self.new_connection(doing).await
    }

    /// A new connection, within the connect timeout.
    async fn new_connection(&self, doing: &str) -> Result<Conn> {
        let silence = u64::try_from(self.inner.silence.as_millis()).unwrap_or(u64::MAX);
        let bound = (self.inner.connect_timeout, self.deadline());
        conn::open(
            &self.inner.options,
            bound,
            &self.inner.sql.open(silence),
            doing,
        )
        .await
    }

    fn give_back(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        conn.reused = false;
        let mut idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.inner.max_idle {
            idle.push(conn);
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Arc<Session>>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The session of a live hold of `lease`, else `NotHeld`.
    fn session_of(&self, lease: &Lease) -> Result<Arc<Session>> {
        let session = self.sessions().get(&lease.owner()).cloned();
        match session {
            Some(s) if !s.lost.is_cancelled() && s.holds(lease) => Ok(s),
            Some(_) => {
                self.sessions().remove(&lease.owner());
                Err(Error::not_held(lease.name()))
            }
            None => Err(Error::not_held(lease.name())),
        }
    }

    /// The error for a refused attempt: a conflict of kinds when a holder
    /// is another kind of lock, else `None` (held).
    fn refused(name: &str, asked: Mode, letters: &str) -> Result<()> {
        let mutex = asked == Mode::Exclusive;
        let other = letters
            .chars()
            .filter_map(kind_of)
            .find(|held| (*held == Mode::Exclusive) != mutex);
        match other {
            Some(held) => Err(Error::ModeConflict {
                name: name.to_owned(),
                held,
                asked,
            }),
            None => Ok(()),
        }
    }

    /// A grant's statement and its arguments (see [`SessionSql::new`]);
    /// `wait_ms` for a wait.
    fn grant(
        &self,
        (name, opts): (&str, &LockOptions),
        (conn, owner): (&Conn, OwnerToken),
        wait_ms: Option<i64>,
    ) -> Result<(sqlx::SqlStr, sqlx::postgres::PgArguments)> {
        let (mode, holder) = (opts.get_mode(), opts.get_holder());
        let write = conn.holder.as_deref() != Some(holder);
        let args = args(|a| {
            a.add(conn.pid)?;
            a.add(key(name))?;
            a.add(mark_prefix(mode, owner))?;
            a.add(wait_ms.unwrap_or(0).to_string())?;
            if write { a.add(holder) } else { Ok(()) }
        })?;
        Ok((self.inner.sql.grant(mode, wait_ms.is_some(), write), args))
    }

    /// A grant's answer: the mark, `None` when refused.
    fn answer(rows: &[PgRow]) -> Result<Option<String>> {
        let row = rows
            .first()
            .ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let (got, mark): (Option<bool>, Option<String>) = (read(row, 0)?, read(row, 1)?);
        match (got, mark) {
            (Some(true), Some(mark)) => Ok(Some(mark)),
            (Some(false), _) => Ok(None),
            _ => Err(moved()),
        }
    }

    /// A granted hold on `conn`: its lease, its session watched.
    fn granted(
        &self,
        (name, opts): (&str, &LockOptions),
        owner: OwnerToken,
        mut conn: Conn,
        mark: String,
    ) -> Result<Lease> {
        let (mode, holder) = (opts.get_mode(), opts.get_holder().to_owned());
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "acquire", &mark))?;
        conn.holder = Some(holder.clone());
        let hold = Held {
            holder,
            owner,
            name: name.to_owned(),
            mode,
            mark,
        };
        let session = Session::new(conn, hold);
        self.sessions().insert(owner, session.clone());
        Ok(
            Lease::with_session(name, owner, fence, session.lost.clone())
                .with_mode(mode)
                .with_holder(opts.get_holder()),
        )
    }

    /// One attempt: the lease, or the connection that was refused.
    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<std::result::Result<Lease, Conn>> {
        let owner = OwnerToken::random()?;
        let by = self.deadline();
        let mut conn = self.connection("acquire").await?;
        let reused = conn.reused;
        let grant = self.grant((name, opts), (&conn, owner), None)?;
        let rows = match self
            .unanswered_undone(&mut conn, grant, by, key(name))
            .await
        {
            // A connection that sat idle may be dead (a server restart):
            // one unanswered statement on it is tried again on a new one.
            // Closed, it holds nothing.
            Err(f) if reused && f.code.is_none() && !f.ended => {
                tracing::debug!(error = %f.error, "an idle connection failed; trying a new one");
                conn = self.new_connection("acquire").await?;
                let grant = self.grant((name, opts), (&conn, owner), None)?;
                self.unanswered_undone(&mut conn, grant, by, key(name))
                    .await?
            }
            done => done?,
        };
        if let Some(mark) = Self::answer(&rows)? {
            return self.granted((name, opts), owner, conn, mark).map(Ok);
        }
        // Refused: by another kind of lock of the name?
        let kinds = (self.inner.sql.kinds(), args(|a| a.add(key(name)))?);
        let rows = query(&mut conn.conn, kinds, by, "acquire").await?;
        let letters: Option<String> = rows.first().map(|r| read(r, 0)).transpose()?.flatten();
        Self::refused(
            name,
            opts.get_mode(),
            letters.as_deref().unwrap_or_default(),
        )?;
        Ok(Err(conn))
    }

    /// Runs a grant on `conn`. Unanswered (its reply lost, or its future
    /// dropped), its server session is ended from another connection:
    /// closing this one frees what it took only once the server sees it
    /// closed, which a black-holed link delays until the session's
    /// silence ends it.
    async fn unanswered_undone(
        &self,
        conn: &mut Conn,
        grant: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        by: Instant,
        key: i64,
    ) -> std::result::Result<Vec<PgRow>, Failure> {
        let mut undo = {
            let (backend, pid) = (self.clone(), conn.pid);
            UndoOnDrop::new(async move { backend.end_wait(pid, key).await })
        };
        let done = query(&mut conn.conn, grant, by, "acquire").await;
        if !matches!(&done, Err(f) if f.code.is_none() && !f.ended) {
            undo.disarm();
        }
        done
    }

    /// One wait statement on `conn`, queued up to `slice`: the lease, or
    /// `None` when the slice ran out.
    async fn wait_slice(
        &self,
        (name, opts): (&str, &LockOptions),
        mut conn: Conn,
        slice: Duration,
    ) -> Result<Option<Lease>> {
        let owner = OwnerToken::random()?;
        let ms = i64::try_from(dlock_core::driver::millis_up(slice))
            .unwrap_or(i64::MAX)
            .max(1);
        let grant = self.grant((name, opts), (&conn, owner), Some(ms))?;
        let by = Instant::now() + slice + self.inner.request_timeout;
        // Dropped while queued, or its answer lost, the wait's session is
        // ended, so that it is not granted the lock for a client that is
        // gone.
        let done = self
            .unanswered_undone(&mut conn, grant, by, key(name))
            .await;
        match done {
            Ok(rows) => match Self::answer(&rows)? {
                Some(mark) => self.granted((name, opts), owner, conn, mark).map(Some),
                None => Err(Error::malformed(NAME, "acquire", "a wait refused")),
            },
            // Out of time, nothing granted as far as the error says; but a
            // grant racing the timeout is kept by the server, and a session
            // lock outlives its statement: the connection is closed (it
            // holds nothing else), never reused.
            Err(Failure {
                code: Some(code), ..
            }) if code == LOCK_NOT_AVAILABLE || code == QUERY_CANCELED => Ok(None),
            Err(f) => Err(f.error),
        }
    }
}

/// A statement answered by another server session than the one asked.
fn moved() -> Error {
    Error::invalid_option(
        "mode",
        "a statement reached another server session than its connection's: the session mode \
         needs connections that keep their session (not a pooler in transaction mode)",
    )
}

#[async_trait]
impl Driver for PgSessionBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Session);
        caps.distributed = true;
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        // The server queues waiters, and grants a freed lock to the first
        // at once; but a wait longer than a slice (30 s) rejoins the
        // queue at its end, so arrival order is not kept.
        caps.notify = true;
        // A connection whose statement had no answer is closed: the server
        // frees what it took once it sees it closed.
        caps.cleanup = true;
        caps.rwlock = true;
        // A closed connection ends its session, and the server frees its
        // locks at once.
        caps.freed_on_disconnect = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        match self.attempt(name, opts).await? {
            Ok(lease) => Ok(Some(lease)),
            Err(conn) => {
                self.give_back(conn);
                Ok(None)
            }
        }
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        // A first attempt refuses a conflict of kinds, which the server's
        // queue would only wait out.
        let mut conn = match self.attempt(name, opts).await? {
            Ok(lease) => return Ok(lease),
            Err(conn) => conn,
        };
        loop {
            let left = deadline.cap(WAIT_SLICE);
            if left.is_zero() {
                self.give_back(conn);
                return Err(deadline.timeout_error(name));
            }
            if let Some(lease) = self.wait_slice((name, opts), conn, left).await? {
                return Ok(lease);
            }
            if deadline.is_past() {
                return Err(deadline.timeout_error(name));
            }
            conn = self.connection("acquire").await?;
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let session = self.session_of(lease)?;
        let mut slot = session.conn.lock().await;
        let by = self.deadline();
        // The statement's future owns the connection, and a guard ends the
        // session's holds unless it is disarmed: dropped mid-statement, the
        // connection is closed and the holds are lost.
        let Some(mut conn) = slot.take() else {
            return Err(Error::not_held(lease.name()));
        };
        let ends = session.lost.clone().drop_guard();
        let kept = session.other(lease.owner());
        let statement = (
            self.inner.sql.release(lease.mode(), kept.is_some()),
            args(|a| {
                a.add(session.pid)?;
                a.add(key(lease.name()))?;
                match &kept {
                    Some((mark, holder)) => {
                        a.add(mark.as_str())?;
                        a.add(holder.as_str())
                    }
                    None => Ok(()),
                }
            })?,
        );
        let done = query(&mut conn.conn, statement, by, "release").await;
        self.sessions().remove(&lease.owner());
        let held = match &done {
            Ok(rows) => rows.first().map(|r| read::<Option<bool>>(r, 0)).transpose(),
            Err(_) => Ok(None),
        };
        match (done, held) {
            (Ok(_), Ok(Some(Some(true)))) => {
                drop(ends.disarm());
                if let Some((_, holder)) = kept {
                    conn.holder = Some(holder);
                }
                if session.forget(lease.owner()) {
                    self.give_back(conn);
                } else {
                    *slot = Some(conn);
                }
                Ok(())
            }
            // A session the server ended (an operator's `force_release`)
            // held nothing more; one that answered "not held" had lost it.
            (Err(f), _) if !f.ended => Err(f.error),
            (Ok(_), Ok(Some(None))) => {
                // The session that holds may serve other clients now:
                // ended, it frees what it holds.
                self.end_session(session.pid).await;
                Err(moved())
            }
            (Ok(_), Err(e)) => Err(e),
            _ => Err(Error::not_held(lease.name())),
        }
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        // A live session keeps its holds: nothing to send.
        self.session_of(lease).map(|_| ())
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if write.mode() != Mode::Write {
            return Err(Error::not_held(write.name()));
        }
        let session = self.session_of(write)?;
        let owner = OwnerToken::random()?;
        let mut slot = session.conn.lock().await;
        let by = self.deadline();
        let Some(mut conn) = slot.take() else {
            return Err(Error::not_held(write.name()));
        };
        let ends = session.lost.clone().drop_guard();
        // The session's own write lock puts its read request ahead of any
        // queued writer: granted at once.
        let (write_mark, write_holder) = session
            .other(owner)
            .ok_or_else(|| Error::not_held(write.name()))?;
        let holder = opts.get_holder().to_owned();
        let args = args(|a| {
            a.add(session.pid)?;
            a.add(key(write.name()))?;
            a.add(mark_prefix(Mode::Read, owner))?;
            a.add(self.ms().to_string())?;
            a.add(holder.as_str())?;
            a.add(format!("{write_mark} {write_holder}"))
        })?;
        let rows = query(
            &mut conn.conn,
            (self.inner.sql.downgrade(), args),
            by,
            "downgrade",
        )
        .await?;
        let mark = Self::answer(&rows)?
            .ok_or_else(|| Error::malformed(NAME, "downgrade", "a wait refused"))?;
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "downgrade", &mark))?;
        let name = write.name().to_owned();
        session.add(Held {
            owner,
            name,
            mode: Mode::Read,
            mark,
            holder,
        });
        self.sessions().insert(owner, session.clone());
        *slot = Some(conn);
        drop(ends.disarm());
        Ok(
            Lease::with_session(write.name(), owner, fence, session.lost.clone())
                .with_mode(Mode::Read)
                .with_holder(opts.get_holder()),
        )
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        // Half the request timeout for the sessions to end, the rest for
        // the answer.
        let args = args(|a| {
            a.add(key(name))?;
            a.add(self.ms() / 2)
        })?;
        // Core gives this call ten request timeouts: the sessions end one
        // after another.
        let by = Instant::now() + self.inner.request_timeout * 9;
        let rows = self
            .statement_by((self.inner.sql.terminate(), args), by, "force_release")
            .await?;
        // This process's own holds among them are lost now, not at their
        // next probe.
        let ended: Vec<i32> = rows.iter().map(|r| read(r, 0)).collect::<Result<_>>()?;
        self.sessions().retain(|_, s| {
            let gone = ended.contains(&s.pid);
            if gone {
                s.lost.cancel();
            }
            !gone
        });
        holders(&rows).map(|all| all.into_iter().next())
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let args = args(|a| {
            a.add(key(name))?;
            a.add(limit)
        })?;
        let rows = self
            .statement((self.inner.sql.holders(), args), "holders")
            .await?;
        holders(&rows)
    }
}

/// The holders `pg_locks` rows show, with their sessions' rows.
fn holders(rows: &[PgRow]) -> Result<Vec<LockInfo>> {
    let mut all = Vec::with_capacity(rows.len());
    for row in rows {
        let application_name: Option<String> = read(row, 1)?;
        let (holder, marks, mode): (String, String, String) =
            (read(row, 2)?, read(row, 3)?, read(row, 4)?);
        all.extend(info(
            application_name.as_deref().unwrap_or_default(),
            &holder,
            &marks,
            &mode,
        ));
    }
    Ok(all)
}

impl PgSessionBackend {
    /// One statement on an idle connection, given back after.
    async fn statement(
        &self,
        statement: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        doing: &str,
    ) -> Result<Vec<PgRow>> {
        self.statement_by(statement, self.deadline(), doing).await
    }

    /// One statement on an idle connection, answered by `by`.
    async fn statement_by(
        &self,
        statement: (sqlx::SqlStr, sqlx::postgres::PgArguments),
        by: Instant,
        doing: &str,
    ) -> Result<Vec<PgRow>> {
        let mut conn = self.connection(doing).await?;
        let rows = query(&mut conn.conn, statement, by, doing).await?;
        self.give_back(conn);
        Ok(rows)
    }

    /// Ends the server session `pid`, which holds for this process but
    /// serves another client (a pooler moved it).
    async fn end_session(&self, pid: i32) {
        let ended = match args(|a| a.add(pid)) {
            Ok(args) => {
                let end = sqlx::SqlStr::from_static("SELECT pg_terminate_backend($1)");
                self.statement((end, args), "release").await.map(drop)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            tracing::warn!(pid, error = %e, "a moved holding session was not ended");
        }
    }

    /// Ends the server session `pid` of a dropped wait for `key`.
    async fn end_wait(&self, pid: i32, key: i64) {
        let ended = match args(|a| {
            a.add(pid)?;
            a.add(key)
        }) {
            Ok(args) => self
                .statement((self.inner.sql.undo(), args), "undo")
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            tracing::warn!(pid, error = %e, "a dropped wait's server session was not ended; it ends once the server sees its connection closed");
        }
    }
}
