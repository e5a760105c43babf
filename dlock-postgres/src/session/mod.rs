//! The session mode: holds are session advisory locks on connections
//! dedicated to holding, as sqlx's `PgAdvisoryLock` takes them, with
//! dlock's API and guarantees (fencing tokens, `lost()`, reader-writer
//! locks, waits queued by the server).

mod acquire;
mod conn;
mod list;
mod mark;
mod marker;
mod release;
mod sql;
mod wait;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::Deadline;
use dlock_core::{
    Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, LockPage, OwnerToken, Result,
};
use sqlx::postgres::PgConnectOptions;
use tokio::time::Instant;

use self::conn::{Conn, Session};
use self::sql::SessionSql;
use crate::backend::NAME;

// SQLSTATEs of a creation that raced another: the catalog's unique
// index, the table, or its row type ("type … already exists").
const UNIQUE_VIOLATION: &str = "23505";
const DUPLICATE_TABLE: &str = "42P07";
const DUPLICATE_OBJECT: &str = "42710";

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
/// is closed. The server ends a session silent for twice the probe period
/// and the request timeout together (`idle_session_timeout`), so a holder paused or cut off loses its
/// lock, after its own probe has failed; a connection closed on the way
/// frees it at once, before the holder's next probe (see
/// [`Capabilities::freed_on_disconnect`]: fence what you write). It needs
/// connections that keep their server session: PostgreSQL itself, or
/// PgBouncer in session mode. A pooler in transaction mode is refused at
/// connect when one server session serves both of two connections, and
/// every statement names the session it is for, so that none takes or
/// gives up a lock on another's.
///
/// Names map to 64-bit advisory-lock keys (a hash): two names of one key
/// contend as one lock (false contention, never a false grant), and so
/// does an application's own advisory lock of that key. `list` reads the
/// names from the holders' table (the server keeps keys, not names: each
/// holding session's row names its hold); `holders` and `force_release`
/// (which ends the holder's session) work by name. No semaphores.
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
        if setup.create {
            backend.create().await?;
        }
        // Two connections served by one server session are a pooler in
        // transaction mode: a lock would stay with a session that serves
        // other clients. (Each statement also names its session.)
        // Opened within the connect timeout, as the lease table's first
        // connection is: a setup's deadline counted from before a slow
        // connect would leave it no time.
        let mut first = backend
            .connection("connect", backend.connect_deadline(), None)
            .await?;
        let second = backend
            .connection("connect", backend.connect_deadline(), None)
            .await?;
        if first.pid == second.pid {
            return Err(Error::invalid_option(
                "mode",
                "the session mode needs connections that keep their server session, and two \
                 connections were served by one (a pooler in transaction mode, such as \
                 PgBouncer's): connect to PostgreSQL itself or to a pooler in session mode, \
                 or use the lease table (the default mode)",
            ));
        }
        backend.give_back(second);
        // Off the connect's path: housekeeping, bounded by the request
        // timeout.
        let pruning = backend.clone();
        tokio::spawn(async move {
            if pruning.prune(&mut first).await {
                pruning.give_back(first);
            }
        });
        conn::watch(Arc::downgrade(&backend.inner));
        Ok(backend)
    }

    /// Creates the holders' table when missing: on a
    /// connection opened within the connect timeout, by a statement
    /// bounded by the request timeout.
    async fn create(&self) -> Result<()> {
        let create = self.inner.sql.create();
        for last in [false, true] {
            let bound = (self.inner.connect_timeout, self.connect_deadline());
            let mut conn = conn::open(&self.inner.options, bound, "SELECT 1", "connect").await?;
            match conn::run(&mut conn.conn, &create, self.deadline(), "connect").await {
                Ok(_) => return Ok(()),
                // Another client created them at the same moment (`IF NOT
                // EXISTS` does not serialize creators): they are there.
                Err(f)
                    if !last
                        && matches!(
                            f.code.as_deref(),
                            Some(UNIQUE_VIOLATION | DUPLICATE_TABLE | DUPLICATE_OBJECT)
                        ) => {}
                Err(f) => return Err(f.error),
            }
        }
        Ok(())
    }

    /// Deletes the rows of ended server sessions, so that the holders'
    /// table keeps about a row per live session, not one per session
    /// ever opened. Best effort: a role that may not delete from it, or
    /// a slow server, leaves the rows, which nothing reads as a hold
    /// (`list` keeps a row only while its session holds the key).
    /// Whether `conn` is fit for a call: not after a failure, which may
    /// leave its transaction block open.
    async fn prune(&self, conn: &mut Conn) -> bool {
        let prune = self.inner.sql.prune();
        match conn::run(&mut conn.conn, &prune, self.deadline(), "connect").await {
            Ok(_) => true,
            Err(f) => {
                tracing::debug!(error = %f.error, "could not delete the rows of ended sessions");
                false
            }
        }
    }

    /// The request timeout in milliseconds.
    fn ms(&self) -> i64 {
        i64::try_from(self.inner.request_timeout.as_millis()).unwrap_or(i64::MAX)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout
    }

    /// When a connection opened now for `connect` must be ready.
    fn connect_deadline(&self) -> Instant {
        Instant::now() + self.inner.connect_timeout
    }

    /// An idle connection the server has not ended for its silence, one
    /// whose row names `name` if there is (its grant writes nothing), or a
    /// new one ready by `by` (and connected within the connect timeout).
    async fn connection(&self, doing: &str, by: Instant, name: Option<&str>) -> Result<Conn> {
        let idle = {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            idle.retain(|c| c.idle_since.elapsed() < self.inner.silence / 2);
            let named = name.and_then(|n| idle.iter().rposition(|c| c.name.as_deref() == Some(n)));
            match named {
                Some(at) => Some(idle.remove(at)),
                None => idle.pop(),
            }
        };
        if let Some(mut conn) = idle {
            conn.reused = true;
            return Ok(conn);
        }
        self.new_connection(doing, by).await
    }

    /// A new connection, ready by `by` (and connected within the connect
    /// timeout).
    async fn new_connection(&self, doing: &str, by: Instant) -> Result<Conn> {
        let silence = u64::try_from(self.inner.silence.as_millis()).unwrap_or(u64::MAX);
        let bound = (self.inner.connect_timeout, by);
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
        self.wait_for(name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_hold(lease).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.keep(lease).await
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        self.downgrade_hold(write, opts).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        self.end_holders(name).await
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        self.holders_of(name, limit).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.list_held(prefix, cursor, limit).await
    }
}
