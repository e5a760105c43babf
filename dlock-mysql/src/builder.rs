//! Settings, the URL, the first connection and the lock table.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::driver::wait::Wakeups;
use dlock_core::{Error, OwnerToken, Result};
use dlock_sql::{Settings, check_url};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use tokio::time::{Instant, timeout_at};

use crate::backend::{Inner, MySqlBackend};
use crate::error::{server_error_number, sql_error, timed_out};
use crate::pool::{My, Pool};
use crate::sql::{Statements, validate_table};
use crate::wake::Sleepers;

/// Settings for [`MySqlBackend`]; start from [`MySqlBackend::builder`].
#[derive(Clone)]
pub struct MySqlBuilder {
    s: Settings,
    /// Where to connect, when it comes from a sqlx pool rather than a URL.
    options: Option<MySqlConnectOptions>,
}

impl std::fmt::Debug for MySqlBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.s
            .debug(f, "MySqlBuilder", &[("from_pool", &self.options.is_some())])
    }
}

dlock_sql::common_setters!(MySqlBuilder);

impl MySqlBuilder {
    /// The lock table (default `dlock_locks`): a plain identifier.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.s.table = table.into();
        self
    }

    /// The longest a waiter goes without looking at the lock again
    /// (default 1 s). With [`wake_ups`](Self::wake_ups), a release wakes
    /// the first queued waiter at once, and the holder's expiry wakes it
    /// too; this bounds the others' sleeps and polls and covers a wake-up
    /// that could not be sent.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.s.max_poll = interval;
        self
    }

    /// Whether waiters queue and sleep in the server, and releases wake
    /// the ones they let in with `KILL QUERY` (default `false`: waiters
    /// poll; see the crate's README for why it is off): waiters served in
    /// the order they came, a releaser asking again at once included, for
    /// up to 5 connections per backend beyond the pool (an anchor and up
    /// to 4 sleeping waiters), opened when it first waits and kept. A
    /// client without it neither queues nor waits for those who do: turn
    /// it on for every client of the table (`?wake_ups=true` in the URL),
    /// and only with a direct connection to the server: behind a proxy
    /// (ProxySQL, a multi-primary router) the connection id a release
    /// kills may name another client's connection. A backend whose pool
    /// does not see its anchor's connection under the id that connection
    /// has (a router spreading connections over servers) finds out at its
    /// first wait, and its waiters poll. On MySQL, whose `GET_LOCK` cannot
    /// wait for a fraction of a second, waiters poll whatever this says.
    /// Those connections come on top of
    /// [`max_connections`](Self::max_connections).
    pub fn wake_ups(mut self, on: bool) -> Self {
        self.s.wake_ups = on;
        self
    }

    /// Whether `connect` creates the lock table when it is missing
    /// (default `true`, with `CREATE TABLE IF NOT EXISTS`). Turn it off
    /// where the application's database user may not create tables; an
    /// administrator then runs [`MySqlBackend::table_ddl`] once.
    pub fn create_table(mut self, create: bool) -> Self {
        self.s.create_table = create;
        self
    }

    /// Checks the settings and the URL without connecting.
    fn validate(&self) -> Result<MySqlConnectOptions> {
        validate_table(&self.s.table)?;
        self.s.check()?;
        match &self.options {
            Some(options) => Ok(options.clone()),
            None => parse_url(&self.s.url(SQLX_PARAMS)?),
        }
    }

    /// Checks the settings, then opens one connection at once, to surface
    /// bad credentials, a missing database or a server that is down now,
    /// and creates the lock table and the shared kinds' stored procedures
    /// if they are missing (unless turned off with
    /// [`MySqlBuilder::create_table`]; without the procedures, which a
    /// user may lack the rights to make, the same calls go as text). Returns within the connect timeout
    /// plus the request timeout.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL, table name or setting,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us.
    pub async fn connect(self) -> Result<MySqlBackend> {
        let options = self.validate()?;
        let pool = Pool::new(
            My::new(options, self.s.connect_timeout)?,
            self.s.max_connections,
            self.s.connect_timeout,
            self.s.request_timeout,
        );
        let mut first = pool.first().await?;
        let sql = Statements::new(&self.s.table);
        let by = Instant::now() + self.s.request_timeout;
        if self.s.create_table {
            let missing = || {
                let t = &self.s.table;
                format!(
                    "the lock table `{t}` or `{t}_holds` is missing and this user may not \
                     create it; have an administrator run:\n{}",
                    sql.ddl()
                )
            };
            for (create, exists) in [
                (sql.create.clone(), sql.exists.clone()),
                (sql.create_holds(), sql.holds_exist()),
            ] {
                let pair = (sqlx::query(create), sqlx::query(exists));
                first.create_unless_there(pair, by, missing).await?;
            }
        }
        // Optional: without the procedures the same calls go as text, so
        // a failure here (no reply in time, say, behind a DDL lock) only
        // costs speed, and the connection, whose state is unknown then.
        match find_procedures(first.conn(), &sql, self.s.create_table, by).await {
            Ok(call) => {
                sql.call.store(call, Ordering::Relaxed);
                first.give_back();
            }
            Err(error) => {
                tracing::info!(%error, "shared calls go as text");
                drop(first);
            }
        }
        Ok(MySqlBackend {
            inner: Arc::new(Inner {
                pool,
                sql,
                wakeups: Wakeups::new(),
                // Unique to this backend: no one else ever waits for it.
                sleepers: Arc::new(Sleepers::new(format!("dlock-a:{}", OwnerToken::random()?))),
                wake_ups: self.s.wake_ups,
                max_poll: self.s.max_poll,
                request_timeout: self.s.request_timeout,
            }),
        })
    }
}

/// Whether the table's procedures of the shared kinds (see `sql/call.rs`)
/// are all there with this release's bodies, made first where missing if
/// `create`. A user who may not create routines keeps the text, which
/// does the same, and so does a table whose name routines cannot tell
/// from another's, or a procedure of that name with another body.
async fn find_procedures(
    conn: &mut MySqlConnection,
    sql: &Statements,
    create: bool,
    by: Instant,
) -> Result<bool> {
    const DOING: &str = "look for the lock table's procedures";
    if !sql.may_call() {
        return Ok(false);
    }
    let late = || timed_out(format!("{DOING}: no reply in time"));
    let creates = sql.create_procedures();
    let complete = async |conn: &mut MySqlConnection| {
        let read = sqlx::query_scalar::<_, i64>(sql.procedures_found()).fetch_one(conn);
        let found = timeout_at(by, read)
            .await
            .map_err(|_| late())?
            .map_err(|e| sql_error(e, DOING))?;
        Ok::<_, Error>(usize::try_from(found) == Ok(creates.len()))
    };
    let found = complete(&mut *conn).await?;
    if found || !create {
        return Ok(found);
    }
    for create in creates.iter().cloned() {
        // Not preparable: CREATE PROCEDURE goes as text.
        let made = sqlx::raw_sql(create).execute(&mut *conn);
        match timeout_at(by, made).await.map_err(|_| late())? {
            Ok(_) => {}
            Err(e) if server_error_number(&e) == Some(ER_SP_ALREADY_EXISTS) => {}
            Err(e) if e.as_database_error().is_some() => {
                tracing::info!(
                    table = sql.table,
                    error = %e,
                    "could not make the lock table's procedures: shared calls go as text"
                );
                return Ok(false);
            }
            Err(e) => return Err(sql_error(e, DOING)),
        }
    }
    // Made here, by another client at once, or there already with
    // another body: only this release's bodies are called.
    complete(&mut *conn).await
}

/// The procedure exists already (made by another client meanwhile).
const ER_SP_ALREADY_EXISTS: u16 = 1304;

/// Brings the `holder` columns of tables made by older releases to this
/// release's (see [`Statements::holder_columns`]); nothing to do on
/// tables made by this one. Only `migrate` does this, never `connect`: the
/// change copies the lock table under a metadata lock that queues every
/// statement on it (a sleeping waiter's holds it off meanwhile), and needs
/// the ALTER right an application's user may lack. Two migrations at once
/// may both change a table: the second finds the column there.
async fn upgrade_holder(
    conn: &mut MySqlConnection,
    sql: &Statements,
    table: &str,
    by: Instant,
) -> Result<()> {
    const DOING: &str = "upgrade the lock table's holder column";
    let late = || timed_out(format!("{DOING}: no reply in time"));
    let read = sqlx::query_as(sql.holder_columns()).fetch_all(&mut *conn);
    let columns: Vec<(Vec<u8>, Vec<u8>)> = timeout_at(by, read)
        .await
        .map_err(|_| late())?
        .map_err(|e| sql_error(e, DOING))?;
    let type_of = |name: &str| {
        columns
            .iter()
            .find(|(table, _)| table.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, data_type)| data_type.to_ascii_lowercase())
    };
    let mut changes = Vec::new();
    if type_of(table).is_some_and(|t| t != b"varbinary") {
        changes.push(sql.upgrade_holder(false));
    }
    if type_of(&format!("{table}_holds")).is_none() {
        changes.push(sql.upgrade_holder(true));
    }
    for change in changes {
        match timeout_at(by, sqlx::query(change).execute(&mut *conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if server_error_number(&e) == Some(ER_DUP_FIELDNAME) => {}
            Ok(Err(e)) => return Err(sql_error(e, DOING)),
            Err(_) => return Err(late()),
        }
    }
    Ok(())
}

/// The column exists already.
const ER_DUP_FIELDNAME: u16 = 1060;

/// The URL parameters sqlx's MySQL driver takes (see the README).
const SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// Parses a `mysql://` or `mariadb://` URL, refusing what sqlx would only
/// notice when it connects (or would quietly replace by a default).
fn parse_url(url: &str) -> Result<MySqlConnectOptions> {
    check_url(
        url,
        ["mysql", "mariadb"],
        "mysql://user:password@host:port/database",
    )?;
    MySqlConnectOptions::from_str(url)
        .map_err(|e| Error::invalid_option("url", format!("not a MySQL URL: {e}")))
}

impl MySqlBackend {
    /// Connects with default settings. URL:
    /// `mysql://user:password@host:3306/database`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL, whose query may give any of them
    /// under its setter's name (`?table=locks&request_timeout=500ms&wake_ups=true`;
    /// a setter called later wins); sqlx's own parameters (`ssl-mode`, …)
    /// pass through, and any other is refused at connect. See the README's
    /// table.
    pub fn builder(url: impl Into<String>) -> MySqlBuilder {
        MySqlBuilder {
            s: Settings::new(&url.into(), false),
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
    /// and each of its connections holds a named lock for its whole life
    /// (how an acquire that timed out is undone), which a connection the
    /// application also uses must not. Size the server's connection limit
    /// for both pools ([`max_connections`](MySqlBuilder::max_connections),
    /// 10 by default).
    ///
    /// ```no_run
    /// # async fn f() -> dlock_core::Result<()> {
    /// use dlock_mysql::{MySqlBackend, sqlx::MySqlPool};
    /// let app_pool = MySqlPool::connect_lazy("mysql://app:secret@db/app").expect("a URL");
    /// let backend = MySqlBackend::builder_from_pool(&app_pool)
    ///     .max_connections(4)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_from_pool(pool: &sqlx::MySqlPool) -> MySqlBuilder {
        MySqlBuilder {
            options: Some(pool.connect_options().as_ref().clone()),
            ..Self::builder("")
        }
    }

    /// The statements that create the lock table `table` and its holds
    /// table (`<table>_holds`, of reader-writer locks and semaphores), for
    /// an administrator to run where the application may not create
    /// tables.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `table` is not a plain identifier of
    /// at most 58 characters.
    pub fn table_ddl(table: &str) -> Result<String> {
        validate_table(table)?;
        Ok(Statements::new(table).ddl())
    }

    /// The statements that make the reader-writer locks' and semaphores'
    /// stored procedures of the lock table `table` (`<table>_sa1`, `_se1`,
    /// `_sr1`), as a script for the `mariadb` or `mysql` command-line
    /// client (`mariadb app < procedures.sql`), for an administrator to
    /// run after [`table_ddl`](Self::table_ddl)'s where the application
    /// may not create routines; it then needs `EXECUTE` on them. Without
    /// them those calls go as text, slower in a crowd (see the README).
    /// `migrate` makes them too. Each is made only if missing (MariaDB
    /// 10.1.3 or MySQL 8.0.29 and later), so the script runs again
    /// without error.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `table` is not a plain identifier of
    /// at most 58 characters, or has capitals: routine names ignore case
    /// where table names may not, so such a table's calls always go as
    /// text.
    pub fn procedures_ddl(table: &str) -> Result<String> {
        validate_table(table)?;
        let sql = Statements::new(table);
        if !sql.may_call() {
            return Err(Error::invalid_option(
                "table",
                format!(
                    "`{table}` has capitals, and routine names ignore case: its calls go as \
                     text, with no stored procedures (name the table in lower case to have them)"
                ),
            ));
        }
        Ok(sql.procedures_script())
    }

    /// Creates the lock table, its holds table and the shared kinds'
    /// stored procedures if they do not exist, as `connect` does by
    /// default (a user who may not create routines goes on without them,
    /// its shared calls as text), and gives tables made by older releases
    /// the holder columns of this one (which `connect` does not: see the
    /// README's upgrade note). Idempotent. Returns within the
    /// request timeout.
    pub async fn migrate(&self) -> Result<()> {
        let by = self.deadline();
        let sql = &self.inner.sql;
        self.execute(sqlx::query(sql.create.clone()), "migrate", by)
            .await?;
        self.execute(sqlx::query(sql.create_holds()), "migrate", by)
            .await?;
        let mut lent = self.inner.pool.lend("migrate", by).await?;
        let table = &self.inner.sql.table;
        let mut upgraded = upgrade_holder(lent.conn(), sql, table, by).await;
        if upgraded.is_ok() {
            upgraded = find_procedures(lent.conn(), sql, true, by)
                .await
                .map(|call| sql.call.store(call, Ordering::Relaxed));
        }
        if upgraded.is_ok() {
            lent.give_back();
        }
        upgraded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_this_database_are_taken() {
        // The rest of the checks are dlock-sql's, tested there.
        let r = parse_url("postgres://u@127.0.0.1/db");
        assert!(matches!(r, Err(Error::InvalidOption { option: "url", .. })));
        assert!(parse_url("mysql://u:p%40ss@127.0.0.1:3306/db").is_ok());
        assert!(parse_url("mariadb://u@localhost/db").is_ok());
    }
}
