//! Settings, and the connect of each mode: the lock table, or the session mode.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::wait::Wakeups;
use dlock_core::{Error, Locker, Result};
use dlock_sql::Settings;
use sqlx::postgres::PgConnectOptions;
use tokio::time::Instant;

use crate::backend::{Inner, PgBackend};
use crate::notify::Listener;
use crate::session::{PgSessionBackend, Setup};
use crate::sql::{Statements, validate_identifier};

mod startup;
mod url;

use startup::counts_places;
use url::{SQLX_PARAMS, no_startup_extras, parse_url};

/// Settings for [`PgBackend`]; start from [`PgBackend::builder`].
#[derive(Clone)]
pub struct PgBuilder {
    schema: String,
    statement_cache: bool,
    session_settings: bool,
    /// `None` unless set: the caller's connect says which.
    mode: Option<PgMode>,
    s: Settings,
    /// Where to connect, when it comes from a sqlx pool rather than a URL.
    options: Option<PgConnectOptions>,
}

impl std::fmt::Debug for PgBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from_pool = self.options.is_some();
        self.s.debug(
            f,
            "PgBuilder",
            &[
                ("schema", &self.schema),
                ("statement_cache", &self.statement_cache),
                ("session_settings", &self.session_settings),
                ("mode", &self.mode),
                ("from_pool", &from_pool),
            ],
        )
    }
}

dlock_sql::common_setters!(PgBuilder);

/// How a PostgreSQL backend holds its locks: see the crate's README for
/// which to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgMode {
    /// A row per hold in a lease table, with a TTL ([`PgBackend`]): works
    /// through any pooler, holds outlive a paused client only until their
    /// TTL.
    LeaseTable,
    /// Session advisory locks ([`PgSessionBackend`]): no table write per
    /// grant and waiters queued by the server, but a connection per hold,
    /// and no pooler in transaction mode.
    Session,
}

impl PgBuilder {
    /// The schema of the lock table (default `public`). Every statement
    /// names it, so that no `search_path` (a role's, or one a session left
    /// on a pooled server connection) can point two clients at two tables.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The lock table (default `dlock_locks`): lower-case letters, digits
    /// and `_`, at most 52 of them.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.s.table = table.into();
        self
    }

    /// The longest a waiter goes without looking at the lock again
    /// (default 1 s). The holder's expiry and a release in this process
    /// wake it sooner.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.s.max_poll = interval;
        self
    }

    /// Whether the statements of frequent calls are prepared (default
    /// `true`): parsing and planning one costs more than running it. They
    /// are prepared with SQL's `PREPARE`, each under a name made of a hash
    /// of its text, and run with `EXECUTE` in a simple query, so this works
    /// through PgBouncer in any pooling mode, whose server connections
    /// come to have each statement prepared once; a session that lacks one
    /// gets it on its first use. Each is planned once, for every call,
    /// which needs PostgreSQL 12 or later: on an older server nothing is
    /// prepared (see the crate's README). Where each connection has its
    /// settings for its whole session ([`session_settings`](Self::session_settings)),
    /// a call of one statement goes as sqlx's prepared statement instead,
    /// its values bound. Off
    /// (`?statement_cache=false`), every statement is parsed and planned on
    /// each call, as by a pooler that refuses `PREPARE`.
    pub fn statement_cache(mut self, on: bool) -> Self {
        self.statement_cache = on;
        self
    }

    /// Whether each connection asks for the statement timeout, isolation
    /// and planner settings for its whole session, as startup options
    /// (default `true`): used only when the first connection reads them
    /// back as its startup options', so never behind a pooler that refuses,
    /// drops or re-applies them (see the crate's README). Off
    /// (`?session_settings=false`), every transaction sets them with `SET
    /// LOCAL`: for a pooler that hands a client server sessions opened with
    /// another client's startup options (pgpool-II's connection cache).
    pub fn session_settings(mut self, on: bool) -> Self {
        self.session_settings = on;
        self
    }

    /// How locks are held (default [`PgMode::LeaseTable`]; `?mode=session`
    /// or `?mode=lease_table` in the URL). [`connect`](Self::connect)
    /// makes a lease-table backend and
    /// [`connect_session`](Self::connect_session) a session one, and each
    /// refuses the other mode; [`connect_locker`](Self::connect_locker)
    /// makes either.
    pub fn mode(mut self, mode: PgMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Whether `connect` creates the lock table when it is missing
    /// (default `true`). Turn it off where the application's role may not
    /// create tables; an administrator then runs [`PgBackend::table_ddl`]
    /// once.
    pub fn create_table(mut self, create: bool) -> Self {
        self.s.create_table = create;
        self
    }

    /// Whether releases wake waiters in other processes (default `false`:
    /// they poll, every `max_poll_interval` at most; see the crate's README
    /// for why it is off). On, a mutex waiter takes a place in the name's
    /// queue, a release announces the waiters it lets in with `pg_notify`
    /// in its own transaction (only when it lets someone in), and a backend
    /// listens on a connection of its own (opened when it first waits,
    /// beyond the pool) and wakes those waiters at once; the others keep
    /// polling. A listener quiet for ten `max_poll_interval`s asks its
    /// server, and connects again when that gets no answer within the
    /// request timeout. Turn it on for every client of the table
    /// (`?wake_ups=true` in the URL). `LISTEN` keeps state in a session, so
    /// the URL must reach PostgreSQL itself, not PgBouncer in transaction
    /// pooling mode: there the listening server connection goes back to
    /// PgBouncer's pool, and the statements of other clients it serves
    /// next fail on the notifications it receives. A listener counts only
    /// once it has heard a notification sent from the pool (a listener
    /// that hears nothing logs a warning and stops, and its backend's
    /// waiters poll).
    /// A release costs one statement more (the name's row is
    /// locked first), and every notifying commit takes a lock that all of
    /// the database's notifying commits share.
    pub fn wake_ups(mut self, on: bool) -> Self {
        self.s.wake_ups = on;
        self
    }

    /// Checks the settings and the URL without connecting.
    fn validate(&self) -> Result<PgConnectOptions> {
        validate_identifier("schema", &self.schema)?;
        validate_identifier("table", &self.s.table)?;
        self.s.check()?;
        match &self.options {
            Some(options) => Ok(no_startup_extras(options.clone())),
            None => parse_url(&self.s.url(SQLX_PARAMS)?),
        }
    }

    /// Checks the settings, then opens one connection at once, to surface
    /// bad credentials, a missing database or a server that is down now,
    /// and creates the lock table if it is missing (unless turned off with
    /// [`PgBuilder::create_table`]). The connection asks for the
    /// statements' settings for its whole session, and reads them back; a
    /// pooler that refuses or drops them gets a second connection, whose
    /// transactions set them (see the crate's README). Returns within the
    /// connect timeout plus twice the request timeout (behind such a
    /// pooler, twice the connect timeout plus twice the request timeout).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL, table name or setting,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us.
    pub async fn connect(self) -> Result<PgBackend> {
        if self.mode == Some(PgMode::Session) {
            return Err(Error::invalid_option(
                "mode",
                "`mode=session` makes a `PgSessionBackend`: connect with \
                 `PgBuilder::connect_session`, `PgBuilder::connect_locker` or `dlock::connect`",
            ));
        }
        let options = self.validate()?;
        let listen = self.s.wake_ups.then(|| options.clone());
        let wanted = Statements::new(
            &self.schema,
            &self.s.table,
            self.s.request_timeout,
            self.statement_cache,
        );
        let (pool, per_session) = if self.session_settings {
            self.open_pool(options, &wanted).await?
        } else {
            (self.pool(options), false)
        };
        let mut first = pool.first().await?;
        // Prepared statements are planned with `plan_cache_mode`, which
        // older servers lack (see `sql::PLANS`; such a server refused it
        // as a startup option).
        let planned = first
            .conn()
            .server_version_num()
            .is_none_or(|version| version >= 120_000);
        let sql = Statements::new(
            &self.schema,
            &self.s.table,
            self.s.request_timeout,
            self.statement_cache && planned,
        );
        let sql = if per_session { sql.per_session() } else { sql };
        if self.s.create_table {
            let by = Instant::now() + self.s.request_timeout;
            let pair = (
                sqlx::raw_sql(sql.create_sql(false).written_out()),
                sqlx::raw_sql(sql.exists().written_out()),
            );
            let missing = || {
                format!(
                    "the lock table `{}` is missing and this role may not create it; \
                     have an administrator run:\n{}",
                    self.s.table,
                    sql.create()
                )
            };
            first.create_unless_there(pair, by, missing).await?;
        }
        let counted = counts_places(&sql, first, self.s.request_timeout).await;
        let sql = sql.counting_places(counted);
        Ok(PgBackend {
            inner: Arc::new(Inner {
                pool,
                sql,
                wakeups: Wakeups::new(),
                queued_wakeups: Wakeups::new(),
                listen,
                listener: Listener::default(),
                max_poll: self.s.max_poll,
                purge: crate::purge::Cursor::default(),
                request_timeout: self.s.request_timeout,
                connect_timeout: self.s.connect_timeout,
            }),
        })
    }
}

impl PgBuilder {
    /// Connects in the session mode ([`PgSessionBackend`]): checks the
    /// settings, opens two connections, refuses a pooler in transaction
    /// mode (both served by one server session), and creates the
    /// holders' table `<schema>.<table>_sessions` when missing (unless turned off
    /// with [`create_table`](Self::create_table)). `max_connections` is
    /// the most idle connections kept, `max_poll_interval` how often a
    /// holding connection is probed; `wake_ups` and `statement_cache` do
    /// not apply. Each step is bounded: the table's creation by the
    /// connect timeout plus the request timeout (twice when another client
    /// creates it at the same moment), each connection by the connect
    /// timeout. Then, in the background, it deletes the rows of sessions
    /// that have ended (where its role may: `DELETE` on the table).
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidOption`] naming
    /// `mode` for a pooler in transaction mode, or a URL that asks for the
    /// lease table.
    pub async fn connect_session(self) -> Result<PgSessionBackend> {
        if self.mode == Some(PgMode::LeaseTable) {
            return Err(Error::invalid_option(
                "mode",
                "`mode=lease_table` makes a `PgBackend`: connect with `PgBuilder::connect`",
            ));
        }
        let options = self.validate()?;
        PgSessionBackend::open(Setup {
            options,
            schema: self.schema,
            table: self.s.table,
            create: self.s.create_table,
            max_idle: self.s.max_connections,
            probe_every: self.s.max_poll,
            request_timeout: self.s.request_timeout,
            connect_timeout: self.s.connect_timeout,
        })
        .await
    }

    /// Connects in the builder's mode (the URL's `mode`, the lease table
    /// by default), for code that lets the URL choose.
    ///
    /// # Errors
    /// Those of [`connect`](Self::connect) or
    /// [`connect_session`](Self::connect_session).
    pub async fn connect_locker(self) -> Result<Locker> {
        Ok(match self.mode {
            Some(PgMode::Session) => Locker::new(self.connect_session().await?),
            _ => Locker::new(self.connect().await?),
        })
    }
}

impl PgBackend {
    /// Connects with default settings. URL:
    /// `postgres://user:password@host:5432/database`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL, whose query may give any of them
    /// under its setter's name (`?schema=app&request_timeout=500ms&wake_ups=true`;
    /// a setter called later wins); sqlx's own parameters (`sslmode`, …)
    /// pass through, and any other is refused at connect. See the README's
    /// table.
    pub fn builder(url: impl Into<String>) -> PgBuilder {
        let mut s = Settings::new(&url.into(), false);
        let schema = s.params.text("schema");
        let statement_cache = s.params.flag("statement_cache").unwrap_or(true);
        let session_settings = s.params.flag("session_settings").unwrap_or(true);
        let mode = s
            .params
            .parsed("mode", "session or lease_table", |v| match v {
                "session" => Some(PgMode::Session),
                "lease_table" => Some(PgMode::LeaseTable),
                _ => None,
            });
        PgBuilder {
            schema: schema.unwrap_or_else(|| "public".to_owned()),
            statement_cache,
            session_settings,
            mode,
            s,
            options: None,
        }
    }

    /// Settings for the server an application's sqlx pool connects to:
    /// its host, credentials, database and TLS come from
    /// [`Pool::connect_options`](sqlx::Pool::connect_options), the rest
    /// are the defaults, changed by the setters.
    ///
    /// The backend opens connections of its own with those options rather
    /// than borrowing the pool's: a renewal must not wait for a connection
    /// behind the application's queries (a busy pool would cost leases),
    /// and the lock statements' session settings must not reach the
    /// application's connections. Size the server's connection limit for
    /// both pools ([`max_connections`](PgBuilder::max_connections), 10 by
    /// default).
    ///
    /// ```no_run
    /// # async fn f() -> dlock_core::Result<()> {
    /// use dlock_postgres::{PgBackend, sqlx::PgPool};
    /// let app_pool = PgPool::connect_lazy("postgres://app:secret@db/app").expect("a URL");
    /// let backend = PgBackend::builder_from_pool(&app_pool)
    ///     .max_connections(4)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_from_pool(pool: &sqlx::PgPool) -> PgBuilder {
        PgBuilder {
            options: Some(pool.connect_options().as_ref().clone()),
            ..Self::builder("")
        }
    }

    /// The statements that create the lock table `table` in `schema` and
    /// its holds table (`<table>_holds`), for an administrator to run where
    /// the application may not create tables.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `schema` or `table` is not a plain
    /// identifier.
    pub fn table_ddl(schema: &str, table: &str) -> Result<String> {
        validate_identifier("schema", schema)?;
        validate_identifier("table", table)?;
        let sql = Statements::new(schema, table, Duration::from_secs(1), false);
        Ok(format!("{}\n{}", sql.create(), sql.upgrade()))
    }

    /// Creates the lock table if it does not exist, as `connect` does by
    /// default, and gives tables made by older releases this one's layout
    /// (which `connect` does not: it needs the tables' owner). Idempotent.
    /// Returns within the request timeout.
    pub async fn migrate(&self) -> Result<()> {
        let sql = self.inner.sql.create_sql(true);
        self.execute(sql, "migrate", self.deadline()).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_this_database_are_taken() {
        // The rest of the checks are dlock-sql's, tested there.
        let r = parse_url("mysql://u@127.0.0.1/db");
        assert!(matches!(r, Err(Error::InvalidOption { option: "url", .. })));
        assert!(parse_url("postgres://u:p%40ss@127.0.0.1:5432/db").is_ok());
        assert!(parse_url("postgresql://u@localhost/db").is_ok());
    }

    /// Each connect refuses the other mode before connecting (port 1:
    /// nothing listens).
    #[tokio::test]
    async fn a_connect_refuses_the_other_mode_naming_it() {
        let url = "postgres://u@127.0.0.1:1/db";
        let refused = |r: Result<()>| match r {
            Err(Error::InvalidOption { option, reason }) => (option, reason),
            other => panic!("expected InvalidOption, got {other:?}"),
        };
        let session = PgBackend::connect(&format!("{url}?mode=session")).await;
        let (option, reason) = refused(session.map(drop));
        assert_eq!(option, "mode");
        assert!(reason.contains("connect_session"), "{reason}");
        let table = PgSessionBackend::connect(&format!("{url}?mode=lease_table")).await;
        assert_eq!(refused(table.map(drop)).0, "mode");
        let bad = PgBackend::builder(format!("{url}?mode=sessions"))
            .connect_locker()
            .await;
        let (option, reason) = refused(bad.map(drop));
        assert_eq!(option, "mode");
        assert!(reason.contains("session or lease_table"), "{reason}");
    }
}
