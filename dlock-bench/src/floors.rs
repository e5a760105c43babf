//! The bare-client floors: what a dlock cycle costs without dlock (the same
//! server operations sent with the client library), one bare round trip,
//! and the locks users write without dlock, for each backend.

use dlock::OwnerToken;
use dlock::etcd::proto::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, compare,
    kv_client::KvClient, request_op,
};
use dlock::etcd::tonic::transport::Channel;
use dlock::mysql::sqlx;
use dlock::redis::redis;
use dlock::zk::zookeeper_client as zk;

use crate::target::{Op, Result};

/// One client's connection, lent with no request of its own: sqlx's pool
/// pings every connection given back to it (sqlx-core 0.9,
/// `return_to_pool`), a round trip per statement that the drivers' own
/// pools do not pay, and so neither may a floor.
pub(crate) type Conn<C> = tokio::sync::Mutex<C>;

pub(crate) struct RedisPing(pub(crate) redis::aio::MultiplexedConnection);

#[async_trait::async_trait]
impl Op for RedisPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: String = redis::cmd("PING").query_async(&mut self.0.clone()).await?;
        Ok(())
    }
}

pub(crate) struct RedisRaw {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
}

impl RedisRaw {
    pub(crate) fn new(conn: redis::aio::MultiplexedConnection) -> Self {
        RedisRaw {
            conn,
            release: redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            ),
        }
    }
}

#[async_trait::async_trait]
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

pub(crate) struct MySqlPing(pub(crate) Conn<sqlx::MySqlConnection>);

#[async_trait::async_trait]
impl Op for MySqlPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: i64 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *self.0.lock().await)
            .await?;
        Ok(())
    }
}

/// The driver's two statements, bare.
pub(crate) struct MySqlRaw(pub(crate) Conn<sqlx::MySqlConnection>);

#[async_trait::async_trait]
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
        .execute(&mut *self.0.lock().await)
        .await?;
        sqlx::query(
            "UPDATE dlock_locks SET owner = '', expires_at = UTC_TIMESTAMP(6) \
             WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .execute(&mut *self.0.lock().await)
        .await?;
        Ok(())
    }
}

pub(crate) struct PgPing(pub(crate) Conn<sqlx::PgConnection>);

#[async_trait::async_trait]
impl Op for PgPing {
    async fn run(&self, _: &str) -> Result<()> {
        let _: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *self.0.lock().await)
            .await?;
        Ok(())
    }
}

/// The driver's two statements, bare: prepared, without the statement
/// timeout.
pub(crate) struct PgRaw(pub(crate) Conn<sqlx::PgConnection>);

#[async_trait::async_trait]
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
        .fetch_optional(&mut *self.0.lock().await)
        .await?;
        sqlx::query(
            "UPDATE dlock_locks SET owner = '', expires_at = clock_timestamp() \
             WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()",
        )
        .bind(name.as_bytes())
        .bind(&owner)
        .execute(&mut *self.0.lock().await)
        .await?;
        Ok(())
    }
}

/// A session advisory lock: no TTL, no fencing, gone unseen with its
/// connection; what a PostgreSQL user would reach for first.
pub(crate) struct PgAdvisory(pub(crate) Conn<sqlx::PgConnection>);

#[async_trait::async_trait]
impl Op for PgAdvisory {
    async fn run(&self, key: &str) -> Result<()> {
        let mut conn = self.0.lock().await;
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

/// The session advisory lock, waited for in the server's queue.
pub(crate) struct PgAdvisoryTurns(pub(crate) Conn<sqlx::PgConnection>);

#[async_trait::async_trait]
impl crate::turns::Turns for PgAdvisoryTurns {
    type Held = String;

    async fn take(&self, name: &str) -> Result<String> {
        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(name)
            .execute(&mut *self.0.lock().await)
            .await?;
        Ok(name.to_owned())
    }

    async fn give(&self, name: String) -> Result<()> {
        let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(name)
            .fetch_one(&mut *self.0.lock().await)
            .await?;
        Ok(())
    }
}

/// The classic scheme: read the row, compare-and-set its version, release.
pub(crate) struct MySqlCas(pub(crate) Conn<sqlx::MySqlConnection>);

#[async_trait::async_trait]
impl Op for MySqlCas {
    async fn run(&self, key: &str) -> Result<()> {
        let owner = OwnerToken::random()?.to_string();
        let row: Option<(u64, i64)> = sqlx::query_as(
            "SELECT version, expires_at <= UTC_TIMESTAMP(6) FROM bench_cas WHERE name = ?",
        )
        .bind(key.as_bytes())
        .fetch_optional(&mut *self.0.lock().await)
        .await?;
        match row {
            None => {
                sqlx::query(
                    "INSERT INTO bench_cas VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)",
                )
                .bind(key.as_bytes())
                .bind(&owner)
                .execute(&mut *self.0.lock().await)
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
                .execute(&mut *self.0.lock().await)
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
            .execute(&mut *self.0.lock().await)
            .await?;
        Ok(())
    }
}

pub(crate) struct ZkPing(pub(crate) zk::Client);

#[async_trait::async_trait]
impl Op for ZkPing {
    async fn run(&self, _: &str) -> Result<()> {
        self.0.check_stat("/").await?;
        Ok(())
    }
}

/// The queue lock's three steps, as dlock and Curator take them: create an
/// ephemeral sequential node, list the queue (sent right behind the
/// create, in the same round trip), delete the node.
pub(crate) struct ZkRaw(pub(crate) zk::Client);

#[async_trait::async_trait]
impl Op for ZkRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let dir = format!("/bench-raw-{key}");
        let path = format!("{dir}/n-");
        let create = self.0.create(&path, &[], &opts);
        let list = self.0.list_children(&dir);
        let (created, listed) = tokio::join!(create, list);
        let (_, seq) = match created {
            Err(zk::Error::NoNode) => {
                let dir_opts = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                self.0.mkdir(&dir, &dir_opts).await?;
                let created = self.0.create(&path, &[], &opts).await?;
                self.0.list_children(&dir).await?;
                created
            }
            other => {
                listed?;
                other?
            }
        };
        self.0.delete(&format!("{path}{seq}"), None).await?;
        Ok(())
    }
}

/// The lock a ZooKeeper user writes by hand: one ephemeral node at a fixed
/// path, created and deleted (no queue: every waiter watches that node).
pub(crate) struct ZkBare(pub(crate) zk::Client);

#[async_trait::async_trait]
impl Op for ZkBare {
    async fn run(&self, key: &str) -> Result<()> {
        let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let path = format!("/bench-bare-{key}");
        self.0.create(&path, &[], &opts).await?;
        self.0.delete(&path, None).await?;
        Ok(())
    }
}

/// The first member an `etcd://` bench URL names, as `host:port`.
pub(crate) fn etcd_addr(url: &str) -> &str {
    url.trim_start_matches("etcd://")
        .split([',', '/'])
        .next()
        .unwrap_or_default()
}

/// One HTTP/2 connection to the etcd a bench URL names.
pub(crate) async fn etcd_channel(url: &str) -> Result<Channel> {
    let addr = etcd_addr(url);
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// A serializable read of a missing key: answered by the member itself,
/// through no consensus round, as ZooKeeper's `exists` is.
pub(crate) struct EtcdPing(pub(crate) Channel);

#[async_trait::async_trait]
impl Op for EtcdPing {
    async fn run(&self, key: &str) -> Result<()> {
        let read = RangeRequest {
            key: format!("bench-ping/{key}").into_bytes(),
            serializable: true,
            ..RangeRequest::default()
        };
        KvClient::new(self.0.clone()).range(read).await?;
        Ok(())
    }
}

/// A key put only if it does not exist (one transaction), then deleted: a
/// lock without a lease, a queue or a token check.
pub(crate) struct EtcdRaw(pub(crate) Channel);

#[async_trait::async_trait]
impl Op for EtcdRaw {
    async fn run(&self, key: &str) -> Result<()> {
        let key = format!("bench-raw/{key}").into_bytes();
        let mut kv = KvClient::new(self.0.clone());
        let put = TxnRequest {
            compare: vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Create as i32,
                key: key.clone(),
                target_union: Some(compare::TargetUnion::CreateRevision(0)),
                range_end: Vec::new(),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: OwnerToken::random()?.to_string().into_bytes(),
                    ..PutRequest::default()
                })),
            }],
            failure: Vec::new(),
        };
        if !kv.txn(put).await?.into_inner().succeeded {
            return Err("an uncontended key existed".into());
        }
        // The KV service's delete, as a transaction's only operation.
        let delete = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key,
                        ..DeleteRangeRequest::default()
                    },
                )),
            }],
            ..TxnRequest::default()
        };
        kv.txn(delete).await?;
        Ok(())
    }
}
