//! The backends under test, their clients, and the bare-client floors.

use std::sync::Arc;
use std::time::Duration;

use dlock::mysql::sqlx;
use dlock::redis::redis;
use dlock::zk::zookeeper_client as zk;
use dlock::{Backend, LockOptions, MemoryBackend, OwnerToken};
use sqlx::Connection as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The bench clients' request timeout: every call returns within it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, BoxError>;

/// A backend to measure and where its server is.
#[derive(Debug, Clone)]
pub enum Target {
    Memory(MemoryBackend),
    Redis(String),
    MySql(String),
    Postgres(String),
    ZooKeeper(String),
}

impl Target {
    pub fn label(&self) -> &'static str {
        match self {
            Target::Memory(_) => "memory",
            Target::Redis(_) => "redis",
            Target::MySql(_) => "mysql",
            Target::Postgres(_) => "postgres",
            Target::ZooKeeper(_) => "zookeeper",
        }
    }

    /// A client of its own: its own connections, as another node would have.
    /// `connections` sizes a SQL pool; the other drivers multiplex one
    /// connection. Calls may take up to [`REQUEST_TIMEOUT`]: the scaling
    /// runs overload the machine on purpose, and a call that gives up
    /// there would end the run rather than measure it.
    pub async fn client(&self, connections: u32) -> Result<Arc<dyn Backend>> {
        Ok(match self {
            Target::Memory(m) => Arc::new(m.clone()),
            Target::Redis(url) => Arc::new(
                dlock::redis::RedisBackend::builder(url)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
            Target::MySql(url) => Arc::new(
                dlock::mysql::MySqlBackend::builder(url)
                    .wake_ups(true)
                    .max_connections(connections)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
            Target::Postgres(url) => Arc::new(
                dlock::postgres::PgBackend::builder(url)
                    .wake_ups(true)
                    .max_connections(connections)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
            Target::ZooKeeper(connect) => Arc::new(
                dlock::zk::ZkBackend::builder(connect.as_str())
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
        })
    }

    pub async fn prepare(&self) -> Result<()> {
        if let Target::Postgres(url) = self {
            dlock::postgres::PgBackend::connect(url).await?;
            sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&mut pg_conn(url).await?)
                .await?;
        }
        if let Target::MySql(url) = self {
            let b = dlock::mysql::MySqlBackend::connect(url).await?;
            b.migrate().await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS bench_cas (name VARBINARY(255) PRIMARY KEY, \
                 owner CHAR(32) NOT NULL, version BIGINT UNSIGNED NOT NULL, \
                 expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
            )
            .execute(&mysql_pool(url).await?)
            .await?;
        }
        Ok(())
    }

    /// One bare round trip (PING, SELECT 1, exists /), the unit hand-off
    /// latency is judged in.
    pub async fn round_trip(&self) -> Result<Option<Box<dyn Op>>> {
        Ok(match self {
            Target::Memory(_) => None,
            Target::Redis(url) => Some(Box::new(RedisPing(redis_conn(url).await?))),
            Target::MySql(url) => Some(Box::new(MySqlPing(mysql_pool(url).await?))),
            Target::Postgres(url) => Some(Box::new(PgPing(pg_pool(url).await?))),
            Target::ZooKeeper(c) => Some(Box::new(ZkPing(zk::Client::connect(c).await?))),
        })
    }

    /// The same server operations as a dlock cycle, sent bare with the
    /// client library: what the cycle would cost without dlock.
    pub async fn raw_floor(&self) -> Result<Option<Box<dyn Op>>> {
        Ok(match self {
            Target::Memory(_) => None,
            Target::Redis(url) => Some(Box::new(RedisRaw::new(redis_conn(url).await?))),
            Target::MySql(url) => Some(Box::new(MySqlRaw(mysql_pool(url).await?))),
            Target::Postgres(url) => Some(Box::new(PgRaw(pg_pool(url).await?))),
            Target::ZooKeeper(c) => Some(Box::new(ZkRaw(zk::Client::connect(c).await?))),
        })
    }

    /// The lock users of the database would write without dlock: the
    /// classic read-then-CAS on a version row (MySQL), a session advisory
    /// lock on one connection per client (PostgreSQL).
    pub async fn classic_cas(&self) -> Result<Option<Box<dyn Op>>> {
        Ok(match self {
            Target::MySql(url) => Some(Box::new(MySqlCas(mysql_pool(url).await?))),
            Target::Postgres(url) => Some(Box::new(PgAdvisory(pg_pool(url).await?))),
            _ => None,
        })
    }

    /// A counter of requests the server has handled, and its memory in use.
    /// `(requests the server has taken from clients, memory in bytes)`.
    pub async fn server_stats(&self) -> Result<Option<(u64, u64)>> {
        Ok(match self {
            Target::Memory(_) => None,
            Target::Redis(url) => {
                let mut c = redis_conn(url).await?;
                let info: String = redis::cmd("INFO").arg("all").query_async(&mut c).await?;
                let field = |k: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.trim().parse().ok())
                        .unwrap_or(0)
                };
                Some((client_requests(&info), field("used_memory")))
            }
            Target::MySql(url) => {
                let pool = mysql_pool(url).await?;
                let (_, questions): (String, String) =
                    sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                        .fetch_one(&pool)
                        .await?;
                sqlx::query("ANALYZE TABLE dlock_locks")
                    .execute(&pool)
                    .await?;
                let size: u64 = sqlx::query_scalar(
                    "SELECT CAST(data_length + index_length AS UNSIGNED) FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name = 'dlock_locks'",
                )
                .fetch_one(&pool)
                .await?;
                Some((questions.parse()?, size))
            }
            Target::Postgres(url) => {
                let mut conn = pg_conn(url).await?;
                // Statements run (pg_stat_statements, at once), not the
                // `SET LOCAL` ahead of each of the driver's.
                let row = sqlx::raw_sql(
                    "SELECT (SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
                       WHERE query NOT ILIKE 'SET %' AND query NOT ILIKE '%pg_stat_statements%'), \
                     pg_total_relation_size('dlock_locks')::bigint",
                )
                .fetch_one(&mut conn)
                .await?;
                let (requests, size): (i64, i64) =
                    (sqlx::Row::try_get(&row, 0)?, sqlx::Row::try_get(&row, 1)?);
                Some((u64::try_from(requests)?, u64::try_from(size)?))
            }
            Target::ZooKeeper(c) => {
                let addr = c.split([',', '/']).next().unwrap_or(c);
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                s.write_all(b"mntr").await?;
                let mut out = String::new();
                s.read_to_string(&mut out).await?;
                let field = |k: &str| {
                    out.lines()
                        .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
                        .unwrap_or(0)
                };
                Some((
                    field("zk_packets_received"),
                    field("zk_approximate_data_size"),
                ))
            }
        })
    }
}

async fn redis_conn(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// One connection, no ping on checkout: the bare client's own round trips.
async fn pg_pool(url: &str) -> Result<sqlx::PgPool> {
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(url)
        .await?)
}

async fn pg_conn(url: &str) -> Result<sqlx::PgConnection> {
    Ok(sqlx::PgConnection::connect(url).await?)
}

async fn mysql_pool(url: &str) -> Result<sqlx::MySqlPool> {
    Ok(sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?)
}

/// One measured operation; `key` is the client's own lock name.
#[dlock::async_trait]
pub trait Op: Send + Sync {
    async fn run(&self, key: &str) -> Result<()>;
}

/// A dlock acquire + release cycle.
pub struct Cycle {
    pub backend: Arc<dyn Backend>,
    pub opts: LockOptions,
}

#[dlock::async_trait]
impl Op for Cycle {
    async fn run(&self, key: &str) -> Result<()> {
        let lease = self
            .backend
            .try_acquire(key, &self.opts)
            .await?
            .ok_or("an uncontended lock was held")?;
        self.backend.release(&lease).await?;
        Ok(())
    }
}

struct RedisPing(redis::aio::MultiplexedConnection);

#[dlock::async_trait]
impl Op for RedisPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: String = redis::cmd("PING").query_async(&mut self.0.clone()).await?;
        Ok(())
    }
}

struct RedisRaw {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
}

impl RedisRaw {
    fn new(conn: redis::aio::MultiplexedConnection) -> Self {
        RedisRaw {
            conn,
            release: redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            ),
        }
    }
}

#[dlock::async_trait]
impl Op for RedisRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let mut c = self.conn.clone();
        let token = OwnerToken::random()?.to_string();
        let key = format!("raw:{{{key}}}");
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut c)
            .await?;
        set.ok_or("raw SET NX found the key held")?;
        let _: i64 = self
            .release
            .key(&key)
            .arg(&token)
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }
}

struct MySqlPing(sqlx::MySqlPool);

#[dlock::async_trait]
impl Op for MySqlPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&self.0).await?;
        Ok(())
    }
}

/// The driver's two statements, bare.
struct MySqlRaw(sqlx::MySqlPool);

#[dlock::async_trait]
impl Op for MySqlRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let owner = OwnerToken::random()?.to_string();
        let name = format!("raw:{key}");
        let ttl: u64 = 30_000_000;
        sqlx::query(
            "INSERT INTO dlock_locks (name, owner, version, expires_at, acquired_at, holder) \
             VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), '') \
             ON DUPLICATE KEY UPDATE owner = IF(expires_at <= UTC_TIMESTAMP(6), ?, owner), \
             version = IF(expires_at <= UTC_TIMESTAMP(6), version + 1, version), \
             expires_at = IF(expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .bind(ttl)
        .bind(&owner)
        .bind(ttl)
        .execute(&self.0)
        .await?;
        sqlx::query(
            "UPDATE dlock_locks SET owner = '', expires_at = UTC_TIMESTAMP(6) \
             WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .execute(&self.0)
        .await?;
        Ok(())
    }
}

struct PgPing(sqlx::PgPool);

#[dlock::async_trait]
impl Op for PgPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&self.0).await?;
        Ok(())
    }
}

/// The driver's two statements, bare: prepared, without the statement
/// timeout.
struct PgRaw(sqlx::PgPool);

#[dlock::async_trait]
impl Op for PgRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let owner = OwnerToken::random()?.to_string();
        let name = format!("raw:{key}");
        sqlx::query(
            "INSERT INTO dlock_locks AS l (name, owner, fence, expires_at, acquired_at, holder) \
             VALUES ($1, $2, 1, clock_timestamp() + interval '30 seconds', clock_timestamp(), '') \
             ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, \
             expires_at = clock_timestamp() + interval '30 seconds' \
             WHERE l.expires_at <= clock_timestamp() RETURNING fence",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .fetch_optional(&self.0)
        .await?;
        sqlx::query(
            "UPDATE dlock_locks SET owner = '', expires_at = clock_timestamp() \
             WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .execute(&self.0)
        .await?;
        Ok(())
    }
}

/// A session advisory lock: no TTL, no fencing, gone unseen with its
/// connection; what a PostgreSQL user would reach for first.
struct PgAdvisory(sqlx::PgPool);

#[dlock::async_trait]
impl Op for PgAdvisory {
    async fn run(&self, key: &str) -> Result<()> {
        let mut conn = self.0.acquire().await?;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if !got {
            return Err("an uncontended advisory lock was held".into());
        }
        let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        Ok(())
    }
}

/// The classic scheme: read the row, compare-and-set its version, release.
struct MySqlCas(sqlx::MySqlPool);

#[dlock::async_trait]
impl Op for MySqlCas {
    async fn run(&self, key: &str) -> Result<()> {
        let owner = OwnerToken::random()?.to_string();
        let row: Option<(u64, i64)> = sqlx::query_as(
            "SELECT version, expires_at <= UTC_TIMESTAMP(6) FROM bench_cas WHERE name = ?",
        )
        .bind(key.as_bytes())
        .fetch_optional(&self.0)
        .await?;
        match row {
            None => {
                sqlx::query(
                    "INSERT INTO bench_cas VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)",
                )
                .bind(key.as_bytes())
                .bind(&owner)
                .execute(&self.0)
                .await?;
            }
            Some((version, 1)) => {
                let done = sqlx::query(
                    "UPDATE bench_cas SET owner = ?, version = version + 1, \
                     expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND \
                     WHERE name = ? AND version = ?",
                )
                .bind(&owner)
                .bind(key.as_bytes())
                .bind(version)
                .execute(&self.0)
                .await?;
                if done.rows_affected() != 1 {
                    return Err("classic CAS lost a race on an uncontended row".into());
                }
            }
            Some(_) => return Err("classic CAS found an uncontended row held".into()),
        }
        sqlx::query("UPDATE bench_cas SET owner = '', expires_at = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ?")
            .bind(key.as_bytes())
            .bind(&owner)
            .execute(&self.0)
            .await?;
        Ok(())
    }
}

struct ZkPing(zk::Client);

#[dlock::async_trait]
impl Op for ZkPing {
    async fn run(&self, _: &str) -> Result<()> {
        self.0.check_stat("/").await?;
        Ok(())
    }
}

/// Create an ephemeral sequential node, delete it.
struct ZkRaw(zk::Client);

#[dlock::async_trait]
impl Op for ZkRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let dir = format!("/bench-raw-{key}");
        let path = format!("{dir}/n-");
        let (_, seq) = match self.0.create(&path, &[], &opts).await {
            Err(zk::Error::NoNode) => {
                let dir_opts = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                self.0.mkdir(&dir, &dir_opts).await?;
                self.0.create(&path, &[], &opts).await?
            }
            other => other?,
        };
        self.0.delete(&format!("{path}{seq}"), None).await?;
        Ok(())
    }
}

/// How long a scenario waits for a grant before calling the run broken.
pub const GRANT_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests clients sent, from `INFO commandstats`: Redis counts the
/// commands a script runs as calls too, so those (the commands dlock's
/// scripts use, which the measured scenarios never send bare) are left out
/// and each script run counts once, as the one request it is.
fn client_requests(info: &str) -> u64 {
    const IN_SCRIPTS: &[&str] = &[
        "get",
        "set",
        "del",
        "pexpire",
        "publish",
        "pttl",
        "time",
        "zrange",
        "zrem",
        "zadd",
        "zscore",
        "exists",
        "zrangebyscore",
    ];
    info.lines()
        .filter_map(|line| {
            let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()?;
            (!IN_SCRIPTS.contains(&command)).then_some(calls)
        })
        .sum()
}
