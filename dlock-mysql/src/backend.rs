use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::wait::{Attempt, Backoff, Deadline, Wakeups, wait_for_lock};
use dlock_core::{
    Backend, Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, OwnerToken, Result,
    async_trait, validate_name,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlPoolOptions};
use tokio::time::Instant;

use crate::sql::{Statements, validate_table};

const NAME: &str = "mysql";

/// MySQL / MariaDB server error numbers the driver tells apart.
const ER_ACCESS_DENIED: u16 = 1045;
const ER_DBACCESS_DENIED: u16 = 1044;
const ER_BAD_DB: u16 = 1049;
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;

/// A MySQL / MariaDB lock backend over the version-row table. Cheap to
/// clone; clones share the pool.
///
/// No transaction or row lock outlives a single statement: the lease is the
/// row's `expires_at`, judged by the database clock. (The pessimistic
/// `SELECT … FOR UPDATE` design instead ties up a connection and a
/// transaction for the whole critical section, and a stalled holder blocks
/// everyone until the server's lock wait timeout.)
#[derive(Debug, Clone)]
pub struct MySqlBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: MySqlPool,
    sql: Statements,
    holder: String,
    wakeups: Wakeups,
}

/// Settings for [`MySqlBackend`]; start from [`MySqlBackend::builder`].
#[derive(Debug, Clone)]
pub struct MySqlBuilder {
    url: String,
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
}

impl MySqlBuilder {
    /// The lock table (default `dlock_locks`): a plain identifier.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the pool opens (default 10).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long to wait for a connection from the pool, or for a new one
    /// (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Opens the pool (one connection at once, to surface bad credentials
    /// or a missing database now). Does not create the table: call
    /// [`MySqlBackend::migrate`] once.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL or table name,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us.
    pub async fn connect(self) -> Result<MySqlBackend> {
        validate_table(&self.table)?;
        if self.max_connections == 0 {
            return Err(Error::invalid_option(
                "max_connections",
                "must be at least 1",
            ));
        }
        let scheme = self
            .url
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase());
        if !matches!(scheme.as_deref(), Some("mysql" | "mariadb")) {
            return Err(Error::invalid_option(
                "url",
                "expected mysql://user:password@host:port/database",
            ));
        }
        let options = MySqlConnectOptions::from_str(&self.url)
            .map_err(|e| Error::invalid_option("url", format!("not a MySQL URL: {e}")))?;
        let pool = MySqlPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(1)
            .acquire_timeout(self.acquire_timeout)
            .connect_with(options)
            .await
            .map_err(|e| sql_error(e, "connect"))?;
        Ok(MySqlBackend {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&self.table),
                holder: holder_info(),
                wakeups: Wakeups::new(),
            }),
        })
    }
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
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::connection(NAME, doing, e),
        sqlx::Error::Configuration(_) => Error::invalid_option("url", e.to_string()),
        _ => Error::backend(NAME, doing, e),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl MySqlBackend {
    /// Connects with default settings. URL:
    /// `mysql://user:password@host:3306/database`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL.
    pub fn builder(url: impl Into<String>) -> MySqlBuilder {
        MySqlBuilder {
            url: url.into(),
            table: "dlock_locks".to_owned(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
        }
    }

    /// Creates the lock table if it does not exist. Idempotent; run it once
    /// at deployment or start-up. Never delete rows from the table: a
    /// deleted row restarts its lock's fencing tokens at 1.
    pub async fn migrate(&self) -> Result<()> {
        sqlx::query(self.inner.sql.create.clone())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| sql_error(e, "migrate"))?;
        Ok(())
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// One acquire statement. Returns the granted version, or `None` when
    /// the lock is held.
    async fn grant(&self, name: &str, owner: &str, ttl: u64) -> Result<Option<u64>> {
        let mut tries = 0;
        loop {
            let done = sqlx::query(self.inner.sql.acquire.clone())
                .bind(name.as_bytes())
                .bind(owner)
                .bind(ttl)
                .bind(&self.inner.holder)
                .bind(owner)
                .bind(&self.inner.holder)
                .bind(ttl)
                .execute(&self.inner.pool)
                .await;
            match done {
                Ok(done) => {
                    let version = done.last_insert_id();
                    return Ok((version != 0).then_some(version));
                }
                // Concurrent first inserts of one name can deadlock on the
                // index; InnoDB rolled this one back, so it is safe to repeat.
                Err(e)
                    if tries < 3
                        && matches!(
                            server_error_number(&e),
                            Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
                        ) =>
                {
                    tries += 1;
                }
                Err(e) => return Err(sql_error(e, "acquire")),
            }
        }
    }

    async fn attempt(&self, name: &str, opts: &LockOptions, waiting: bool) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let ttl = micros(opts.ttl_value());
        if let Some(version) = self.grant(name, &owner.to_string(), ttl).await? {
            return Ok(Attempt::Acquired(Lease::with_ttl(
                name, owner, version, opts, sent,
            )));
        }
        // Only a waiter needs the holder's remaining lease, to cap its sleep.
        let expires_in = if waiting {
            let left: Option<i64> = sqlx::query_scalar(self.inner.sql.remaining.clone())
                .bind(name.as_bytes())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| sql_error(e, "read the holder's lease"))?;
            left.map(|us| Duration::from_micros(us.unsigned_abs()))
        } else {
            None
        };
        Ok(Attempt::Held { expires_in })
    }

    /// Runs a statement that changes the caller's own live row; "not held"
    /// unless it matched one.
    async fn own_row(
        &self,
        query: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
        lease: &Lease,
        doing: &str,
    ) -> Result<()> {
        // sqlx sets CLIENT_FOUND_ROWS: rows matched, not rows changed.
        let done = query
            .execute(&self.inner.pool)
            .await
            .map_err(|e| sql_error(e, doing))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: lease.name().to_owned(),
            })
        }
    }
}

#[async_trait]
impl Backend for MySqlBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lease: LeaseKind::Ttl,
            fencing: true,
            fencing_survives_restart: true,
            notify: false,
            fifo: false,
            distributed: true,
        }
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        validate_name(name)?;
        opts.validate()?;
        Ok(self.attempt(name, opts, false).await?.into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        validate_name(name)?;
        opts.validate()?;
        let deadline = Deadline::after(opts.wait_value());
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        wait_for_lock(name, deadline, Some(&self.inner.wakeups), backoff, || {
            self.attempt(name, opts, true)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let query = sqlx::query(self.inner.sql.release.clone())
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.own_row(query, lease, "release").await?;
        // Waiters in this process; others find out by polling.
        self.inner.wakeups.wake(lease.name());
        Ok(())
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

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        let row: Option<(String, u64, i64)> = sqlx::query_as(self.inner.sql.inspect.clone())
            .bind(name.as_bytes())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| sql_error(e, "inspect"))?;
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
