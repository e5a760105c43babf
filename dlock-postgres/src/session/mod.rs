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
use sqlx::postgres::PgConnectOptions;
use tokio::time::Instant;

use self::conn::{Held, Session, read};
use self::sql::{SessionSql, fence_of, info, key, kind_of};
use crate::backend::NAME;

// SQLSTATEs of a creation that raced another.
const UNIQUE_VIOLATION: &str = "23505";
const DUPLICATE_TABLE: &str = "42P07";

/// The longest a client waits for an unbounded wait's answer.
const FOREVER: Duration = Duration::from_secs(365 * 86_400);

/// A PostgreSQL lock backend over session advisory locks: what sqlx's
/// `PgAdvisoryLock` does, with fencing tokens, `lost()`, reader-writer
/// locks and waits the server queues. Made by
/// [`PgBuilder::connect_session`](crate::PgBuilder::connect_session) or a
/// URL with `?mode=session`. Cheap to clone; clones share the
/// connections.
///
/// A hold lives as long as its connection's server session, as a
/// ZooKeeper session's nodes do: no TTL, nothing to renew, and a paused
/// holder keeps its lock while its TCP connection lives (the fencing
/// token covers it). Each hold has a connection of its own, probed every
/// `max_poll_interval`; a probe unanswered within the request timeout, or
/// answered by another server session, ends the hold: the guard's
/// `lost()` fires and the connection is closed, which frees the lock once
/// the server sees it closed. It needs connections that keep their server
/// session: PostgreSQL itself, or PgBouncer in session mode; a pooler in
/// transaction mode is refused at connect.
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
    idle: Mutex<Vec<sqlx::PgConnection>>,
    max_idle: usize,
    /// The holding connections, by the owner token of each hold.
    held: Mutex<HashMap<OwnerToken, Arc<Session>>>,
    probe_every: Duration,
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
        // The server ends a holding session silent this long: twice what
        // the client takes to learn that its probes go unanswered.
        let silence = (setup.probe_every + setup.request_timeout) * 2;
        let silence_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX);
        let backend = PgSessionBackend {
            inner: Arc::new(Inner {
                options: setup.options,
                sql: SessionSql::new(&setup.schema, &setup.table, silence_ms),
                idle: Mutex::default(),
                max_idle: usize::try_from(setup.max_idle).unwrap_or(usize::MAX),
                held: Mutex::default(),
                probe_every: setup.probe_every,
                request_timeout: setup.request_timeout,
                connect_timeout: setup.connect_timeout,
            }),
        };
        let by = backend.deadline();
        let mut first = backend.connection("connect").await?;
        if setup.create {
            let create = backend.inner.sql.create();
            if let Err(f) = conn::run(&mut first, &create, by, "connect").await {
                // Another client created them at the same moment (`IF NOT
                // EXISTS` does not serialize creators): they are there.
                if !matches!(f.code.as_deref(), Some(UNIQUE_VIOLATION | DUPLICATE_TABLE)) {
                    return Err(f.error);
                }
                first = backend.connection("connect").await?;
                conn::run(&mut first, &create, by, "connect").await?;
            }
        }
        // Two connections served by one server session are a pooler in
        // transaction mode: a lock would stay with a session that serves
        // other clients, and the next statement could reach another one.
        let mut second = backend.connection("connect").await?;
        let one = conn::pid(&mut first, by).await?;
        let two = conn::pid(&mut second, by).await?;
        if one == two {
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
        Ok(backend)
    }

    /// The request timeout in milliseconds.
    fn ms(&self) -> u64 {
        u64::try_from(self.inner.request_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout
    }

    /// An idle connection, or a new one within the connect timeout.
    async fn connection(&self, doing: &str) -> Result<sqlx::PgConnection> {
        let idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match idle {
            Some(conn) => Ok(conn),
            None => conn::open(&self.inner.options, self.inner.connect_timeout, doing).await,
        }
    }

    fn give_back(&self, conn: sqlx::PgConnection) {
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

    /// A granted hold on `conn`: its lease, its session watched.
    fn granted(
        &self,
        name: &str,
        opts: &LockOptions,
        owner: OwnerToken,
        (conn, pid, mark): (sqlx::PgConnection, i32, String),
    ) -> Result<Lease> {
        let (mode, holder) = (opts.get_mode(), opts.get_holder());
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "acquire", &mark))?;
        let hold = Held {
            owner,
            name: name.to_owned(),
            mode,
            mark,
        };
        let session = Session::new(conn, pid, hold);
        let lease = Lease::with_session(name, owner, fence, session.lost.clone())
            .with_mode(mode)
            .with_holder(holder);
        self.sessions().insert(owner, session.clone());
        conn::watch(Arc::downgrade(&self.inner), session);
        Ok(lease)
    }

    /// The error for a refused attempt: a conflict of kinds when a holder
    /// is another kind of lock, else `None` (held).
    fn refused(name: &str, asked: Mode, letters: &str) -> Result<Option<Lease>> {
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
            None => Ok(None),
        }
    }

    /// One attempt: the lease, or the connection that was refused and its
    /// server session.
    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<std::result::Result<Lease, (sqlx::PgConnection, i32)>> {
        let (mode, owner) = (opts.get_mode(), OwnerToken::random()?);
        let by = self.deadline();
        let mut conn = self.connection("acquire").await?;
        let attempt = self
            .inner
            .sql
            .attempt(key(name), mode, owner, opts.get_holder());
        // A failure drops the connection, whatever it holds: closed, it
        // holds nothing once the server sees it closed.
        let rows = conn::run(&mut conn, &attempt, by, "acquire").await?;
        let row = rows
            .last()
            .ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let (pid, mark, letters): (i32, Option<String>, Option<String>) =
            (read(row, 0)?, read(row, 1)?, read(row, 2)?);
        match mark {
            Some(mark) => self.granted(name, opts, owner, (conn, pid, mark)).map(Ok),
            None => {
                Self::refused(name, mode, letters.as_deref().unwrap_or_default())?;
                Ok(Err((conn, pid)))
            }
        }
    }
}

#[async_trait]
impl Driver for PgSessionBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Session);
        caps.distributed = true;
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        // The server queues waiters, and grants a freed lock to the first
        // at once.
        caps.notify = true;
        caps.fifo = true;
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
            Err((conn, _)) => {
                self.give_back(conn);
                Ok(None)
            }
        }
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        // A first attempt refuses a conflict of kinds, which the server's
        // queue would only wait out.
        let (mut conn, pid) = match self.attempt(name, opts).await? {
            Ok(lease) => return Ok(lease),
            Err(refused) => refused,
        };
        let (mode, owner) = (opts.get_mode(), OwnerToken::random()?);
        let left = (opts.get_wait().is_some()).then(|| deadline.cap(Duration::MAX));
        let wait_ms = left.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
        // Core cuts a bounded wait off one request timeout after its
        // bound; an unbounded one waits as long as the server queues it.
        let by = Instant::now() + left.unwrap_or(FOREVER).min(FOREVER) + self.inner.request_timeout;
        let sql = self
            .inner
            .sql
            .wait(key(name), mode, owner, opts.get_holder(), wait_ms);
        // Dropped while queued, the wait's session is ended, so that it is
        // not granted the lock for a client that is gone.
        let mut undo = {
            let backend = self.clone();
            UndoOnDrop::new(async move { backend.terminate(pid).await })
        };
        let done = conn::run(&mut conn, &sql, by, "acquire").await;
        undo.disarm();
        let rows = match done {
            Ok(rows) => rows,
            Err(_) if deadline.is_past() => return Err(deadline.timeout_error(name)),
            Err(f) => return Err(f.error),
        };
        let row = rows
            .last()
            .ok_or_else(|| Error::malformed(NAME, "acquire", "no row"))?;
        let (pid, mark): (i32, String) = (read(row, 0)?, read(row, 1)?);
        self.granted(name, opts, owner, (conn, pid, mark))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let session = self.session_of(lease)?;
        let by = self.deadline();
        let mut slot = session.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return Err(Error::not_held(lease.name()));
        };
        let after = session.mark_without(lease.owner());
        let sql = self
            .inner
            .sql
            .release(key(lease.name()), lease.mode(), after.as_deref());
        let done = conn::run(conn, &sql, by, "release").await;
        self.sessions().remove(&lease.owner());
        let held = match &done {
            Ok(rows) => rows
                .last()
                .map(|row| Ok::<_, Error>((read::<i32>(row, 0)?, read::<bool>(row, 1)?)))
                .transpose()?
                .is_some_and(|(pid, held)| held && pid == session.pid),
            Err(_) => false,
        };
        if !held {
            // Another session answered, or none: what this one holds is
            // not known, and closing it frees it. A session the server
            // ended (an operator's `force_release`) held nothing more.
            session.lose(&mut slot);
            return match done {
                Err(f) if !f.ended => Err(f.error),
                _ => Err(Error::not_held(lease.name())),
            };
        }
        if let Some(conn) = session.forget(lease.owner(), &mut slot) {
            self.give_back(conn);
        }
        Ok(())
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
        let by = self.deadline();
        let mut slot = session.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return Err(Error::not_held(write.name()));
        };
        // The session's own write lock puts its read request ahead of any
        // queued writer: granted at once.
        let (holder, ms) = (opts.get_holder(), Some(self.ms()));
        let sql = self
            .inner
            .sql
            .wait(key(write.name()), Mode::Read, owner, holder, ms);
        let done = conn::run(conn, &sql, by, "downgrade").await;
        let mark = match done.map_err(Error::from).and_then(|rows| {
            let row = rows
                .last()
                .ok_or_else(|| Error::malformed(NAME, "downgrade", "no row"))?;
            read::<String>(row, 1)
        }) {
            Ok(mark) => mark,
            Err(e) => {
                session.lose(&mut slot);
                return Err(e);
            }
        };
        drop(slot);
        let fence = fence_of(&mark).ok_or_else(|| Error::malformed(NAME, "downgrade", &mark))?;
        session.add(Held {
            owner,
            name: write.name().to_owned(),
            mode: Mode::Read,
            mark,
        });
        self.sessions().insert(owner, session.clone());
        Ok(
            Lease::with_session(write.name(), owner, fence, session.lost.clone())
                .with_mode(Mode::Read)
                .with_holder(opts.get_holder()),
        )
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        // Half the request timeout for the sessions to end, the rest for
        // the answer.
        let terminate = self.inner.sql.terminate(key(name), self.ms() / 2);
        let rows = self.statement(&terminate, "force_release").await?;
        holders(&rows).map(|mut all| (!all.is_empty()).then(|| all.remove(0)))
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        let rows = self
            .statement(&self.inner.sql.holders(key(name), limit), "holders")
            .await?;
        holders(&rows)
    }
}

/// The holders `pg_locks` rows show, with their sessions' rows.
fn holders(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<LockInfo>> {
    let mut all = Vec::with_capacity(rows.len());
    for row in rows {
        let (mark, mode): (String, String) = (read(row, 1)?, read(row, 2)?);
        all.extend(info(&mark, &mode));
    }
    Ok(all)
}

impl PgSessionBackend {
    /// One statement on an idle connection, given back after.
    async fn statement(&self, sql: &str, doing: &str) -> Result<Vec<sqlx::postgres::PgRow>> {
        let by = self.deadline();
        let mut conn = self.connection(doing).await?;
        let rows = conn::run(&mut conn, sql, by, doing).await?;
        self.give_back(conn);
        Ok(rows)
    }

    /// Ends the server session `pid` (a wait its caller dropped).
    async fn terminate(&self, pid: i32) {
        let sql = format!("SELECT pg_terminate_backend({pid})");
        if let Err(e) = self.statement(&sql, "undo").await {
            tracing::warn!(pid, error = %e, "a dropped wait's server session was not ended; it ends once the server sees its connection closed");
        }
    }
}
