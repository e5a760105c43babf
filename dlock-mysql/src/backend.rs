use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::undo::{UndoOnDrop, retry_for};
use dlock_core::wait::{Attempt, Backoff, Deadline, Wakeups, on_arrival};
use dlock_core::{
    Backend, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo, LockOptions, LockPage,
    OwnerToken, Result, async_trait, check_duration, check_hold, validate_name,
};
use sqlx::Connection;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use tokio::time::{Instant, sleep, timeout};

use crate::pool::{LendError, Lent, Pool};
use crate::sql::{Batch, Statements, validate_table};
use crate::wake::{Sleeper, Sleepers};

const NAME: &str = "mysql";

/// MySQL / MariaDB server error numbers the driver tells apart.
const ER_ACCESS_DENIED: u16 = 1045;
const ER_DBACCESS_DENIED: u16 = 1044;
const ER_BAD_DB: u16 = 1049;
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_TABLEACCESS_DENIED: u16 = 1142;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;

/// The longest any duration setting may be: beyond it, surely a mistake.
const MAX_SETTING: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a row must have been expired before a purge may delete it:
/// the database clock may step back by less than this without a purged
/// name's next token falling below its last (the Redis driver keeps its
/// counter as long).
pub const MIN_PURGE_AGE: Duration = Duration::from_secs(60 * 60);

/// A MySQL / MariaDB lock backend over the version-row table. Cheap to
/// clone; clones share the pool.
///
/// No transaction or row lock outlives a single statement: the lease is the
/// row's `expires_at`, judged by the database clock. (The pessimistic
/// `SELECT … FOR UPDATE` design instead ties up a connection and a
/// transaction for the whole critical section, and a stalled holder blocks
/// everyone until the server's lock wait timeout.)
///
/// Every statement is bounded by the request timeout. A statement that
/// times out has an unknown outcome: its connection is closed rather than
/// returned to the pool, and an acquire is undone by its owner token in
/// the background, so the name is not blocked for a whole TTL.
#[derive(Clone)]
pub struct MySqlBackend {
    inner: Arc<Inner>,
}

// By hand: the connect options inside hold the password.
impl std::fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBackend")
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Inner {
    pool: Pool,
    sql: Statements,
    holder: String,
    wakeups: Wakeups,
    sleepers: Arc<Sleepers>,
    wake_ups: bool,
    max_poll: Duration,
    request_timeout: Duration,
}

/// Settings for [`MySqlBackend`]; start from [`MySqlBackend::builder`].
#[derive(Clone)]
pub struct MySqlBuilder {
    url: String,
    table: String,
    max_connections: u32,
    connect_timeout: Duration,
    request_timeout: Duration,
    max_poll: Duration,
    wake_ups: bool,
    create_table: bool,
}

impl std::fmt::Debug for MySqlBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBuilder")
            .field("url", &dlock_core::redact_url(&self.url))
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_poll", &self.max_poll)
            .field("wake_ups", &self.wake_ups)
            .field("create_table", &self.create_table)
            .finish()
    }
}

impl MySqlBuilder {
    /// The lock table (default `dlock_locks`): a plain identifier.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the pool opens (default 10). With
    /// [`wake_ups`](Self::wake_ups), up to 5 more serve waiters.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long to wait for a new connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one statement may take, the wait for a pooled connection
    /// included, before it counts as failed (default 2 s). A statement
    /// that times out may still have run: its connection is discarded, and
    /// an acquire is undone by its owner token.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The longest a waiter goes without looking at the lock again
    /// (default 1 s). A release wakes the waiter registered for the name at
    /// once, and the holder's expiry wakes it too; this bounds the others'
    /// polls and covers a wake-up that could not be sent.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll = interval;
        self
    }

    /// Whether waiters sleep in the server and releases wake them with
    /// `KILL QUERY` (default `false`: waiters poll; see the crate's
    /// README): hand-offs across processes in about a millisecond, for up
    /// to 5 connections per backend beyond the pool (an anchor and up to 4
    /// sleeping waiters), opened when it first waits and kept. Turn it on
    /// for every client of the table, and only with a direct connection to
    /// the server: behind a proxy (ProxySQL, a multi-primary router) the
    /// connection id a release kills may name another client's connection.
    /// On MySQL, whose `GET_LOCK` cannot wait for a fraction of a second,
    /// waiters poll whatever this says.
    pub fn wake_ups(mut self, on: bool) -> Self {
        self.wake_ups = on;
        self
    }

    /// Whether `connect` creates the lock table when it is missing
    /// (default `true`, with `CREATE TABLE IF NOT EXISTS`). Turn it off
    /// where the application's database user may not create tables; an
    /// administrator then runs [`MySqlBackend::table_ddl`] once.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Checks the settings and the URL without connecting.
    fn validate(&self) -> Result<MySqlConnectOptions> {
        validate_table(&self.table)?;
        if self.max_connections == 0 {
            return Err(Error::invalid_option(
                "max_connections",
                "must be at least 1",
            ));
        }
        let ms = Duration::from_millis(1);
        check_duration("connect_timeout", self.connect_timeout, ms, MAX_SETTING)?;
        check_duration("request_timeout", self.request_timeout, ms, MAX_SETTING)?;
        let min_poll = Duration::from_millis(10);
        check_duration("max_poll_interval", self.max_poll, min_poll, MAX_SETTING)?;
        parse_url(&self.url)
    }

    /// Checks the settings, then opens one connection at once, to surface
    /// bad credentials, a missing database or a server that is down now,
    /// and creates the lock table if it is missing (unless turned off with
    /// [`MySqlBuilder::create_table`]).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL, table name or setting,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us.
    pub async fn connect(self) -> Result<MySqlBackend> {
        let options = self.validate()?;
        // A first connection at once reports what went wrong ("connection
        // refused", "access denied") instead of a later statement.
        let mut first = match timeout(
            self.connect_timeout,
            MySqlConnection::connect_with(&options),
        )
        .await
        {
            Ok(Ok(first)) => first,
            Ok(Err(e)) => return Err(sql_error(e, "connect")),
            Err(_) => {
                return Err(timed_out(format!(
                    "connect: no answer within {:?}",
                    self.connect_timeout
                )));
            }
        };
        let sql = Statements::new(&self.table);
        if self.create_table {
            create_table(&mut first, &sql, &self.table, self.request_timeout).await?;
        }
        let pool = Pool::new(options, self.max_connections, self.connect_timeout);
        pool.put(first);
        Ok(MySqlBackend {
            inner: Arc::new(Inner {
                pool,
                sql,
                holder: holder_info(),
                wakeups: Wakeups::new(),
                // Unique to this backend: no one else ever waits for it.
                sleepers: Arc::new(Sleepers::new(format!("dlock-a:{}", OwnerToken::random()?))),
                wake_ups: self.wake_ups,
                max_poll: self.max_poll,
                request_timeout: self.request_timeout,
            }),
        })
    }
}

/// Creates the lock table unless it exists. A user without the CREATE
/// privilege is fine when the table is there already; otherwise the error
/// says what to run, and as whom.
async fn create_table(
    conn: &mut MySqlConnection,
    sql: &Statements,
    table: &str,
    limit: Duration,
) -> Result<()> {
    let created = timeout(limit, sqlx::query(sql.create.clone()).execute(&mut *conn)).await;
    let denied = match created {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) if server_error_number(&e) == Some(ER_TABLEACCESS_DENIED) => e,
        Ok(Err(e)) => return Err(sql_error(e, "create the lock table")),
        Err(_) => {
            return Err(timed_out(format!(
                "create the lock table: no reply within {limit:?}"
            )));
        }
    };
    let exists = timeout(limit, sqlx::query(sql.exists.clone()).execute(&mut *conn)).await;
    if let Ok(Ok(_)) = exists {
        return Ok(());
    }
    Err(Error::backend(
        NAME,
        format!(
            "the lock table `{table}` is missing and this user may not create it; \
             have an administrator run:\n{}",
            sql.create.as_str()
        ),
        denied,
    ))
}

/// Parses a `mysql://` or `mariadb://` URL, refusing what sqlx would only
/// notice when it connects (or would quietly replace by a default).
fn parse_url(url: &str) -> Result<MySqlConnectOptions> {
    let bad = |reason: &str| Error::invalid_option("url", reason.to_owned());
    let parsed = url::Url::parse(url)
        .map_err(|e| Error::invalid_option("url", format!("not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "mysql" | "mariadb") {
        return Err(bad("expected mysql://user:password@host:port/database"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad(
            "no host: expected mysql://user:password@host:port/database",
        ));
    }
    for (part, text) in [
        ("user name", parsed.username()),
        ("password", parsed.password().unwrap_or_default()),
        ("database", parsed.path()),
    ] {
        if !percent_decodes(text) {
            // The part itself is not shown: it may be a password.
            return Err(Error::invalid_option(
                "url",
                format!("the {part} has a malformed %-escape or is not UTF-8"),
            ));
        }
    }
    MySqlConnectOptions::from_str(url)
        .map_err(|e| Error::invalid_option("url", format!("not a MySQL URL: {e}")))
}

/// Whether every `%` in `s` starts a two-digit hex escape and the decoded
/// bytes are UTF-8.
fn percent_decodes(s: &str) -> bool {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => out.push(b),
                None => return false,
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).is_ok()
}

/// `host:pid`, shown in the table for operators.
fn holder_info() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let mut info = format!("{host}:{}", std::process::id());
    info.truncate(info.floor_char_boundary(255));
    info
}

fn server_error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

fn sql_error(e: sqlx::Error, doing: &str) -> Error {
    match server_error_number(&e) {
        Some(ER_ACCESS_DENIED | ER_DBACCESS_DENIED) => {
            return Error::backend(NAME, format!("{doing}: access denied"), e);
        }
        Some(ER_BAD_DB) => return Error::backend(NAME, format!("{doing}: unknown database"), e),
        Some(ER_NO_SUCH_TABLE) => {
            return Error::backend(
                NAME,
                format!("{doing}: the lock table is missing; call MySqlBackend::migrate() once"),
                e,
            );
        }
        _ => {}
    }
    match e {
        // Say what the network said ("connection refused"), not just that
        // it failed.
        sqlx::Error::Io(ref io) => Error::connection(NAME, format!("{doing}: {io}"), e),
        sqlx::Error::PoolTimedOut => {
            Error::connection(NAME, format!("{doing}: no free connection in the pool"), e)
        }
        sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::connection(NAME, doing, e),
        sqlx::Error::Configuration(_) => Error::invalid_option("url", e.to_string()),
        _ => Error::backend(NAME, doing, e),
    }
}

fn timed_out(message: String) -> Error {
    Error::connection(
        NAME,
        message,
        std::io::Error::from(std::io::ErrorKind::TimedOut),
    )
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A statement's outcome. A reply (an error answer included) gives the
/// connection back to the pool; no reply in time, or a broken connection,
/// closes it: a statement may still be in flight on it.
fn settle<T>(
    lent: Lent<'_>,
    done: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    limit: Duration,
    doing: &str,
) -> Result<T> {
    match done {
        Ok(Ok(value)) => {
            lent.give_back();
            Ok(value)
        }
        Ok(Err(e)) if e.as_database_error().is_some() => {
            lent.give_back();
            Err(sql_error(e, doing))
        }
        Ok(Err(e)) => Err(sql_error(e, doing)),
        Err(_) => Err(timed_out(format!("{doing}: no reply within {limit:?}"))),
    }
}

impl MySqlBackend {
    /// Connects with default settings. URL:
    /// `mysql://user:password@host:3306/database`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// The named lock this backend's registered waiters wait for, so that a
    /// test can take its connection away.
    #[doc(hidden)]
    pub fn wake_anchor_for_tests(&self) -> &str {
        self.inner.sleepers.anchor_name()
    }

    /// Settings, starting from a URL.
    pub fn builder(url: impl Into<String>) -> MySqlBuilder {
        MySqlBuilder {
            url: url.into(),
            table: "dlock_locks".to_owned(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            max_poll: Duration::from_secs(1),
            wake_ups: false,
            create_table: true,
        }
    }

    /// The statement that creates the lock table `table`, for an
    /// administrator to run where the application may not create tables.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `table` is not a plain identifier.
    pub fn table_ddl(table: &str) -> Result<String> {
        validate_table(table)?;
        Ok(Statements::new(table).create.as_str().to_owned())
    }

    /// Creates the lock table if it does not exist, as `connect` does by
    /// default. Idempotent.
    pub async fn migrate(&self) -> Result<()> {
        let query = sqlx::query(self.inner.sql.create.clone());
        self.execute(query, "migrate").await?;
        Ok(())
    }

    /// Deletes up to `limit` rows whose lease ended more than `older_than`
    /// (at least [`MIN_PURGE_AGE`], an hour) ago, and returns how many it
    /// deleted. Safe at any time: a held or recently released lock is
    /// never touched, and fencing tokens do not depend on the row, so a
    /// name acquired again after its row was purged still gets a greater
    /// token, unless the database clock steps back by more than
    /// `older_than`. Call it in a loop while it returns
    /// `limit`, or let [`MySqlBackend::spawn_purger`] do it.
    pub async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64> {
        check_duration("older_than", older_than, MIN_PURGE_AGE, MAX_SETTING * 365)?;
        let age = micros(older_than);
        let query = sqlx::query_scalar(self.inner.sql.purge_candidates.clone())
            .bind(age)
            .bind(limit);
        let limit_time = self.inner.request_timeout;
        let mut lent = self.lend("purge").await?;
        let done = timeout(limit_time, query.fetch_all(lent.conn())).await;
        let names: Vec<Vec<u8>> = settle(lent, done, limit_time, "purge")?;
        let mut deleted = 0;
        for name in names {
            let query = sqlx::query(self.inner.sql.purge.clone())
                .bind(name)
                .bind(age);
            deleted += self.execute(query, "purge").await?.rows_affected();
        }
        Ok(deleted)
    }

    /// Starts a background task that purges rows expired for longer than
    /// `older_than`, every `every` (jittered), in batches of 1,000. It runs
    /// until the returned handle is dropped; failures are logged and tried
    /// again at the next round. Needs a tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `every` is under a second.
    pub fn spawn_purger(&self, every: Duration, older_than: Duration) -> Result<Purger> {
        if every < Duration::from_secs(1) {
            return Err(Error::invalid_option(
                "every",
                format!("must be at least 1s, got {every:?}"),
            ));
        }
        let backend = self.clone();
        let task = tokio::spawn(async move {
            loop {
                sleep(dlock_core::wait::jitter(every)).await;
                loop {
                    match backend.purge_expired(older_than, 1000).await {
                        Ok(1000) => continue,
                        Ok(n) => tracing::debug!(deleted = n, "purged expired lock rows"),
                        Err(e) => tracing::warn!(error = %e, "purging expired lock rows failed"),
                    }
                    break;
                }
            }
        });
        Ok(Purger(task.abort_handle()))
    }

    /// A pooled connection, waited for no longer than the request timeout.
    async fn lend(&self, doing: &str) -> Result<Lent<'_>> {
        match self.inner.pool.lend(self.inner.request_timeout).await {
            Ok(lent) => Ok(lent),
            Err(LendError::Connect(e)) => Err(sql_error(e, doing)),
            Err(LendError::TimedOut) => Err(timed_out(format!(
                "{doing}: no connection within {:?}",
                self.inner.request_timeout
            ))),
        }
    }

    /// Runs one statement, prepared or written out in full (see
    /// [`Batch`]), on a lent connection.
    async fn execute<'q>(
        &self,
        query: impl sqlx::Execute<'q, MySql> + 'q,
        doing: &str,
    ) -> Result<sqlx::mysql::MySqlQueryResult> {
        use sqlx::Executor;
        let limit = self.inner.request_timeout;
        let mut lent = self.lend(doing).await?;
        let done = timeout(limit, lent.conn().execute(query)).await;
        settle(lent, done, limit, doing)
    }

    /// One acquire statement. Returns the granted version, or `None` when
    /// the lock is held.
    async fn grant(
        &self,
        name: &str,
        owner_token: OwnerToken,
        lease_ttl: Duration,
    ) -> Result<Option<u64>> {
        let owner_text = owner_token.to_string();
        let (owner, ttl) = (owner_text.as_str(), micros(lease_ttl));
        let mut tries = 0;
        loop {
            let query = sqlx::query(self.inner.sql.acquire.clone())
                .bind(name.as_bytes())
                .bind(owner)
                .bind(ttl)
                .bind(&self.inner.holder)
                .bind(owner)
                .bind(&self.inner.holder)
                .bind(ttl);
            let limit = self.inner.request_timeout;
            let mut lent = self.lend("acquire").await?;
            // Armed from the moment the statement may reach the server until
            // its reply is in: one that timed out, or whose future was
            // dropped, may still have taken the lock.
            let mut undo = {
                let (backend, name) = (self.clone(), name.to_owned());
                UndoOnDrop::new(async move { backend.undo(&name, owner_token, lease_ttl).await })
            };
            let done = timeout(limit, query.execute(lent.conn())).await;
            // Any answer from the server settles the outcome (an error was
            // rolled back). Disarm then, or the undo of a deadlocked try
            // would release the next try's grant: it has the same owner.
            let answered = match &done {
                Ok(Ok(_)) => true,
                Ok(Err(e)) => e.as_database_error().is_some(),
                Err(_) => false,
            };
            if answered {
                undo.disarm();
            }
            match done {
                // Concurrent first inserts of one name can deadlock on the
                // index; InnoDB rolled this one back, so it is safe to repeat.
                Ok(Err(e))
                    if tries < 3
                        && matches!(
                            server_error_number(&e),
                            Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
                        ) =>
                {
                    tries += 1;
                    lent.give_back();
                }
                done => {
                    let version = settle(lent, done, limit, "acquire")?.last_insert_id();
                    return Ok((version != 0).then_some(version));
                }
            }
        }
    }

    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        if let Some(version) = self.grant(name, owner, opts.ttl_value()).await? {
            let lease = Lease::with_ttl(name, owner, version, opts, sent);
            return Ok(on_arrival(self, lease));
        }
        // Waiters do not need the holder's remaining lease: the registered
        // one sleeps in the server until it ends.
        Ok(Attempt::Held { expires_in: None })
    }

    /// Runs a statement that changes the caller's own live row; "not held"
    /// unless it matched one.
    async fn own_row(
        &self,
        query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
        lease: &Lease,
        doing: &str,
    ) -> Result<()> {
        // sqlx sets CLIENT_FOUND_ROWS: rows matched, not rows changed.
        if self.execute(query, doing).await?.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: lease.name().to_owned(),
            })
        }
    }

    /// Runs a release statement for `name` (the plain release, or an
    /// undo) and wakes its waiters: those in this process, and the waiter
    /// registered for the name, whose connection the statement reports.
    /// The kill goes on the same connection as the release, so that it
    /// reaches the server that read the registration. Returns rows matched.
    async fn release_row(
        &self,
        query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
        name: &str,
        doing: &str,
    ) -> Result<u64> {
        let limit = self.inner.request_timeout;
        let mut lent = self.lend(doing).await?;
        let done = timeout(limit, query.execute(lent.conn())).await;
        let sleeper = match &done {
            Ok(Ok(r)) if r.rows_affected() == 1 && self.inner.wake_ups => r.last_insert_id(),
            _ => 0,
        };
        if sleeper == 0 {
            let rows = settle(lent, done, limit, doing)?.rows_affected();
            if rows == 1 {
                self.inner.wakeups.wake(name);
            }
            return Ok(rows);
        }
        // Only the waiters' own connections are ever registered, so this
        // cuts short nothing but a sleep. A user who may not kill that
        // connection (another MySQL user) gets an error, and the waiter
        // wakes at the end of the lease or of its poll.
        let kill = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {sleeper}")));
        match timeout(limit, kill.execute(lent.conn())).await {
            Ok(Ok(_)) => lent.give_back(),
            Ok(Err(e)) if e.as_database_error().is_some() => {
                tracing::debug!(name, error = %e, "could not wake the registered waiter");
                lent.give_back();
            }
            // The connection's state is unknown: it is closed, not reused.
            _ => drop(lent),
        }
        self.inner.wakeups.wake(name);
        Ok(1)
    }

    /// Acquire's wait: attempts, with one waiter per name registered to
    /// sleep in the server until a release wakes it, the others polling
    /// (and taking the registration over when it frees).
    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        let local = self.inner.wakeups.register(name);
        let max_poll = self.inner.max_poll;
        let mut backoff = Backoff::new(Duration::from_millis(50).min(max_poll), max_poll);
        let mut failures = 0;
        loop {
            let mut woken = std::pin::pin!(local.notified());
            if let Some(lease) = self.look(name, opts, deadline, &mut failures).await? {
                return Ok(lease);
            }
            if let Some(mut sleeper) = self.register(name).await {
                let limit = self.inner.request_timeout;
                let granted = self.sleep_wait(&mut sleeper, name, opts, deadline).await;
                // On a task of its own: a lease in hand must neither wait
                // for the unregister nor be lost if this future is dropped
                // during it.
                let unregister = self.inner.sql.unregister.clone();
                tokio::spawn(sleeper.unregister(unregister, name.to_owned(), limit));
                match granted {
                    Ok(Some(lease)) => return Ok(lease),
                    Ok(None) => {} // the sleeper connection broke: poll
                    Err(e) => return Err(e),
                }
                continue;
            }
            tokio::select! {
                () = sleep(deadline.cap(backoff.next_delay())) => {}
                () = &mut woken => backoff.reset(),
            }
        }
    }

    /// One look of a wait: the lease when granted; `None` when the lock is
    /// held, or the attempt failed in a way worth another try (up to three
    /// in a row), and the wait bound has not passed.
    async fn look(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
        failures: &mut u32,
    ) -> Result<Option<Lease>> {
        match self.attempt(name, opts).await {
            Ok(Attempt::Acquired(lease)) => return Ok(Some(lease)),
            Ok(Attempt::Held { .. }) => *failures = 0,
            Err(e) if e.is_retryable() && *failures < 3 && !deadline.is_past() => *failures += 1,
            Err(e) => return Err(e),
        }
        if deadline.is_past() {
            return Err(deadline.timeout_error(name));
        }
        Ok(None)
    }

    /// Registers as the waiter of `name`: `None` when another waiter is,
    /// or this backend's sleeper connections are all busy or not open yet.
    async fn register(&self, name: &str) -> Option<Sleeper> {
        if !self.inner.wake_ups {
            return None;
        }
        let sleepers = &self.inner.sleepers;
        if let Some(claim) = sleepers.open_claim() {
            // Opening a connection can take long on a busy server: not on
            // this waiter's path. It polls meanwhile.
            let backend = self.clone();
            tokio::spawn(async move {
                let inner = &backend.inner;
                claim
                    .open(&inner.pool, &inner.sql, inner.request_timeout)
                    .await;
            });
        }
        let (sql, limit) = (&self.inner.sql, self.inner.request_timeout);
        Sleeper::register(sleepers, sql, name, limit).await
    }

    /// The registered waiter's loop: attempt, then sleep in the server
    /// until the lease ends or a release wakes us. `None` if the sleeper
    /// connection broke.
    async fn sleep_wait(
        &self,
        sleeper: &mut Sleeper,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Lease>> {
        let mut failures = 0;
        loop {
            // Registered before this look: a release from here on wakes us.
            if let Some(lease) = self.look(name, opts, deadline, &mut failures).await? {
                return Ok(Some(lease));
            }
            let (sql, limit) = (&self.inner.sql, self.inner.request_timeout);
            let cap = deadline.cap(self.inner.max_poll);
            if !sleeper.sleep(sql, name, cap, limit).await {
                return Ok(None);
            }
        }
    }

    /// Releases `name` if `owner` holds it, retrying while the database is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    async fn undo(&self, name: &str, owner: OwnerToken, ttl: Duration) {
        let released = retry_for(ttl, || async {
            let query = sqlx::query(self.inner.sql.release.clone())
                .bind(name.as_bytes())
                .bind(owner.to_string());
            self.release_row(query, name, "undo an acquire").await
        })
        .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }
}

/// The background purge task of [`MySqlBackend::spawn_purger`]; dropping
/// it stops the task.
#[derive(Debug)]
pub struct Purger(tokio::task::AbortHandle);

impl Drop for Purger {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait]
impl Backend for MySqlBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        // Tokens fold in the database clock (tested across a restart and
        // a deleted row); durable only with the settings in the README.
        caps.fencing_survives_restart = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        validate_name(name)?;
        opts.validate()?;
        Ok(self.attempt(name, opts).await?.into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        validate_name(name)?;
        opts.validate()?;
        let deadline = Deadline::after(opts.wait_value());
        let wait = self.wait(name, opts, deadline);
        deadline.bound(name, self.inner.request_timeout, wait).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let query = sqlx::query(self.inner.sql.release.clone())
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        if self.release_row(query, lease.name(), "release").await? != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        Ok(())
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        check_hold(hold)?;
        if hold.is_zero() {
            return self.release(lease).await;
        }
        // The row expires on the database clock.
        let query = sqlx::query(self.inner.sql.hold.clone())
            .bind(lease.owner().for_hold().to_string())
            .bind(micros(hold).max(1))
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.own_row(query, lease, "release_after").await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = micros(lease.ttl().unwrap_or_default());
        let query = sqlx::query(self.inner.sql.extend.clone())
            .bind(ttl)
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.own_row(query, lease, "extend").await?;
        lease.extended(sent);
        Ok(())
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut held = vec![false; leases.len()];
        // One statement per TTL, and a batch's leases nearly always share one.
        let mut ttls: Vec<Duration> = leases.iter().filter_map(Lease::ttl).collect();
        ttls.sort_unstable();
        ttls.dedup();
        for ttl in ttls {
            let mut batch = Batch::default();
            let mut members = Vec::new();
            for (i, lease) in leases.iter().enumerate() {
                if lease.ttl() == Some(ttl) {
                    batch.push(lease.name().as_bytes(), &lease.owner().to_string());
                    members.push(i);
                }
            }
            let sent = Instant::now();
            let update = sqlx::raw_sql(self.inner.sql.extend_many(&batch, micros(ttl)));
            let matched = self.execute(update, "extend").await?.rows_affected();
            let extended: Vec<usize> = if usize::try_from(matched).is_ok_and(|m| m == members.len())
            {
                members
            } else {
                // Some were lost: ask which rows are still ours, which are
                // exactly those the update extended.
                let select = sqlx::raw_sql(self.inner.sql.owned_of(&batch));
                let limit = self.inner.request_timeout;
                let mut lent = self.lend("extend").await?;
                let done = timeout(limit, select.fetch_all(lent.conn())).await;
                let rows = settle(lent, done, limit, "extend")?;
                let owned: std::collections::HashSet<Vec<u8>> = rows
                    .iter()
                    .filter_map(|row| sqlx::Row::try_get::<Vec<u8>, _>(row, 0).ok())
                    .collect();
                members
                    .into_iter()
                    .filter(|&i| {
                        let mut pair = leases[i].owner().to_string().into_bytes();
                        pair.extend_from_slice(leases[i].name().as_bytes());
                        owned.contains(&pair)
                    })
                    .collect()
            };
            for i in extended {
                leases[i].extended(sent);
                held[i] = true;
            }
        }
        Ok(held)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let limit = limit.clamp(1, 10_000);
        let mut pattern = Vec::with_capacity(prefix.len() + 1);
        for &b in prefix.as_bytes() {
            if matches!(b, b'!' | b'%' | b'_') {
                pattern.push(b'!');
            }
            pattern.push(b);
        }
        pattern.push(b'%');
        let query = sqlx::query_as(self.inner.sql.list.clone())
            .bind(cursor.unwrap_or_default().as_bytes())
            .bind(pattern)
            .bind(u32::try_from(limit).unwrap_or(u32::MAX));
        let limit_time = self.inner.request_timeout;
        let mut lent = self.lend("list").await?;
        let done = timeout(limit_time, query.fetch_all(lent.conn())).await;
        let rows: Vec<(Vec<u8>, String, u64, i64)> = settle(lent, done, limit_time, "list")?;
        // The next page starts after the last row read, kept or not.
        let next = (rows.len() == limit)
            .then(|| {
                rows.last()
                    .map(|(name, ..)| String::from_utf8_lossy(name).into_owned())
            })
            .flatten();
        let mut locks = Vec::with_capacity(rows.len());
        for (name, owner, version, left) in rows {
            let (Ok(name), Ok(owner)) = (String::from_utf8(name), owner.parse()) else {
                continue; // not a row this driver wrote
            };
            let expires_in = Some(Duration::from_micros(left.unsigned_abs()));
            locks.push(HeldLock::new(
                name,
                LockInfo::new(owner, version, expires_in),
            ));
        }
        Ok(LockPage::new(locks, next))
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        let query = sqlx::query_as(self.inner.sql.inspect.clone()).bind(name.as_bytes());
        let limit = self.inner.request_timeout;
        let mut lent = self.lend("inspect").await?;
        let done = timeout(limit, query.fetch_optional(lent.conn())).await;
        let row: Option<(String, u64, i64)> = settle(lent, done, limit, "inspect")?;
        let Some((owner, version, left)) = row else {
            return Ok(None);
        };
        let owner = owner.parse().map_err(|_| Error::Backend {
            backend: NAME,
            message: format!("the table holds a malformed owner token {owner:?}"),
            source: None,
        })?;
        Ok(Some(LockInfo::new(
            owner,
            version,
            Some(Duration::from_micros(left.unsigned_abs())),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_connecting() {
        for bad in [
            "mysql://",
            "mysql:///db",
            "mysql://u:%zz@127.0.0.1/db",
            "mysql://u:%E9@127.0.0.1/db",
            "mysql://u:p@127.0.0.1/%",
            "postgres://u@127.0.0.1/db",
            "not a url",
        ] {
            assert!(
                matches!(
                    parse_url(bad),
                    Err(Error::InvalidOption { option: "url", .. })
                ),
                "{bad}"
            );
        }
        assert!(parse_url("mysql://u:p%40ss@127.0.0.1:3306/db").is_ok());
        assert!(parse_url("mariadb://u@localhost/db").is_ok());
    }

    #[test]
    fn escapes_are_checked() {
        assert!(percent_decodes("a%20b%C3%A9"));
        assert!(!percent_decodes("%"));
        assert!(!percent_decodes("%2"));
        assert!(!percent_decodes("%zz"));
        assert!(!percent_decodes("%FF"));
    }
}
