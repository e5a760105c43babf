//! The backends under test, their clients, and the bare-client floors.

use std::sync::Arc;
use std::time::Duration;

use dlock::mysql::sqlx;
use dlock::redis::redis;
use dlock::zk::zookeeper_client as zk;
use dlock::{Backend, LockOptions, MemoryBackend};
use sqlx::Connection as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::floors::{
    Conn, EtcdPing, EtcdRaw, MySqlCas, MySqlPing, MySqlRaw, PgAdvisory, PgAdvisoryTurns, PgPing,
    PgRaw, RedisPing, RedisRaw, ZkBare, ZkPing, ZkRaw, etcd_addr, etcd_channel,
};

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
    /// PostgreSQL's session mode.
    PgSession(String),
    ZooKeeper(String),
    Etcd(String),
}

impl Target {
    pub fn label(&self) -> &'static str {
        match self {
            Target::Memory(_) => "memory",
            Target::Redis(_) => "redis",
            Target::MySql(_) => "mysql",
            Target::Postgres(_) => "postgres",
            Target::PgSession(_) => "postgres-session",
            Target::ZooKeeper(_) => "zookeeper",
            Target::Etcd(_) => "etcd",
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
            // A connection per hold, opened as needed.
            Target::PgSession(url) => Arc::new(
                dlock::postgres::PgBackend::builder(url)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect_session()
                    .await?,
            ),
            Target::ZooKeeper(connect) => Arc::new(
                dlock::zk::ZkBackend::builder(connect.as_str())
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
            Target::Etcd(url) => Arc::new(
                dlock::etcd::EtcdBackend::builder(url)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await?,
            ),
        })
    }

    /// Whether a client can hold 100,000 leases: not with a connection
    /// per hold.
    pub fn holds_many(&self) -> bool {
        !matches!(self, Target::PgSession(_))
    }

    /// Whether the backend has semaphores (the shared scenario's).
    pub fn has_semaphores(&self) -> bool {
        !matches!(self, Target::PgSession(_))
    }

    pub async fn prepare(&self) -> Result<()> {
        if let Target::Postgres(url) | Target::PgSession(url) = self {
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
            Target::MySql(url) => Some(Box::new(MySqlPing(mysql_client(url).await?))),
            Target::Postgres(url) | Target::PgSession(url) => {
                Some(Box::new(PgPing(pg_client(url).await?)))
            }
            Target::ZooKeeper(c) => Some(Box::new(ZkPing(zk::Client::connect(c).await?))),
            Target::Etcd(url) => Some(Box::new(EtcdPing(etcd_channel(url).await?))),
        })
    }

    /// The same server operations as a dlock cycle, sent bare with the
    /// client library: what the cycle would cost without dlock.
    pub async fn raw_floor(&self) -> Result<Option<Box<dyn Op>>> {
        Ok(match self {
            Target::Memory(_) => None,
            Target::Redis(url) => Some(Box::new(RedisRaw::new(redis_conn(url).await?))),
            Target::MySql(url) => Some(Box::new(MySqlRaw(mysql_client(url).await?))),
            Target::Postgres(url) => Some(Box::new(PgRaw(pg_client(url).await?))),
            // The same locks, bare: no fence, no holder written.
            Target::PgSession(url) => Some(Box::new(PgAdvisory(pg_client(url).await?))),
            Target::ZooKeeper(c) => Some(Box::new(ZkRaw(zk::Client::connect(c).await?))),
            Target::Etcd(url) => Some(Box::new(EtcdRaw(etcd_channel(url).await?))),
        })
    }

    /// The lock users of the server would write without dlock: the
    /// classic read-then-CAS on a version row (MySQL), a session advisory
    /// lock on one connection per client (PostgreSQL), one ephemeral node
    /// at a fixed path (ZooKeeper: create + delete, no queue).
    pub async fn classic_cas(&self) -> Result<Option<Box<dyn Op>>> {
        Ok(match self {
            Target::MySql(url) => Some(Box::new(MySqlCas(mysql_client(url).await?))),
            Target::Postgres(url) | Target::PgSession(url) => {
                Some(Box::new(PgAdvisory(pg_client(url).await?)))
            }
            Target::ZooKeeper(c) => Some(Box::new(ZkBare(zk::Client::connect(c).await?))),
            _ => None,
        })
    }

    /// `clients` clients of the bare lock users of the server would write
    /// without dlock, where its waiters queue in the server: a session
    /// advisory lock (PostgreSQL), one connection each.
    pub async fn classic_turns(&self, clients: usize) -> Result<Option<Vec<PgAdvisoryTurns>>> {
        let (Target::Postgres(url) | Target::PgSession(url)) = self else {
            return Ok(None);
        };
        let mut turns = Vec::with_capacity(clients);
        for _ in 0..clients {
            turns.push(PgAdvisoryTurns(pg_conn(url).await?.into()));
        }
        Ok(Some(turns))
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
            Target::Postgres(url) | Target::PgSession(url) => {
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
            Target::Etcd(url) => {
                let metrics = etcd_metrics(url).await?;
                // Calls and streams opened, whatever they carry: a batch of
                // keep-alives on one stream is one request.
                let sum = |k: &str| -> f64 {
                    metrics
                        .lines()
                        .filter(|l| l.starts_with(k))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum()
                };
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Some((
                    sum("grpc_server_started_total{") as u64,
                    sum("etcd_mvcc_db_total_size_in_use_in_bytes ") as u64,
                ))
            }
        })
    }
}

/// etcd's Prometheus metrics, read from its client port.
async fn etcd_metrics(url: &str) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(etcd_addr(url)).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

async fn redis_conn(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn pg_conn(url: &str) -> Result<sqlx::PgConnection> {
    Ok(sqlx::PgConnection::connect(url).await?)
}

/// A bare client's one connection (see [`Conn`]).
async fn pg_client(url: &str) -> Result<Conn<sqlx::PgConnection>> {
    Ok(Conn::new(pg_conn(url).await?))
}

/// A bare client's one connection (see [`Conn`]).
async fn mysql_client(url: &str) -> Result<Conn<sqlx::MySqlConnection>> {
    Ok(Conn::new(sqlx::MySqlConnection::connect(url).await?))
}

/// A pool for the set-up and the server's counters.
async fn mysql_pool(url: &str) -> Result<sqlx::MySqlPool> {
    Ok(sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?)
}

/// One measured operation; `key` is the client's own lock name.
#[async_trait::async_trait]
pub trait Op: Send + Sync {
    async fn run(&self, key: &str) -> Result<()>;
}

/// A dlock acquire + release cycle.
pub struct Cycle {
    pub backend: Arc<dyn Backend>,
    pub opts: LockOptions,
}

#[async_trait::async_trait]
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
        "zcount",
        "hset",
        "hget",
        "hdel",
        "spublish",
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
