#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use dlock_core::{
    Backend, CancellationToken, Capabilities, Election, Error, ErrorKind, Fence, Finished, Guard,
    HeldLock, JobOptions, JobOutcome, JobRun, Leader, Leadership, Lease, LeaseKind, LockInfo,
    LockOptions, LockPage, Locker, MAX_HOLDER_LEN, MAX_HOLDERS, MemoryBackend, Mode, MultiGuard,
    Observed, Observer, OnLost, OwnerToken, Result, RunReport, RunResult, Schedule, ScheduledJob,
    Semaphore, Term, check_fence, validate_name,
};

#[doc(hidden)]
pub use dlock_core::__private;

/// Runs an async fn under a lock named by its arguments; see
/// [`dlock_macros::locked`].
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use dlock_macros::locked;

/// The Redis driver.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dlock_redis as redis;

/// The MySQL / MariaDB driver.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use dlock_mysql as mysql;

/// The PostgreSQL driver.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use dlock_postgres as postgres;

/// The ZooKeeper driver.
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use dlock_zk as zk;

/// The etcd driver.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use dlock_etcd as etcd;

/// Connects to the lock service a URL names, picking the driver by scheme:
///
/// | scheme | driver | feature |
/// |---|---|---|
/// | `redis://`, `rediss://`, `redis+unix://` | Redis | `redis` (`redis-tls` for `rediss`) |
/// | `redis+sentinel://host:port[,…]/service` | Redis behind Sentinel | `redis` |
/// | `redis+cluster://host:port[,…]` | Redis Cluster | `redis` |
/// | `mysql://`, `mariadb://` | MySQL / MariaDB (the lock table is created if missing) | `mysql` |
/// | `postgres://`, `postgresql://` | PostgreSQL, directly or through PgBouncer (the lock table is created if missing); `?mode=session`: session advisory locks (`dlock_postgres::PgSessionBackend`) | `postgres` |
/// | `zk://` or `zookeeper://host:port[,host:port...][/chroot]` | ZooKeeper | `zookeeper` |
/// | `etcd://[user:password@]host:port[,host:port...][/prefix]` | etcd | `etcd` (`etcd-tls` for `etcds://`) |
/// | `memory://` | in-process, a fresh lock space per call | none |
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locker = dlock::connect("memory://").await?;
/// let guard = locker.acquire("job:nightly", &dlock::LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// Settings go in the URL's query under the builder setters' names
/// (`?request_timeout=500ms&accept_eviction_risk=true`), beside the client
/// library's own parameters (`sslmode=…`); each driver's README lists them.
///
/// # Errors
/// [`Error::InvalidOption`] for an unknown scheme, or one whose driver's
/// feature is off (the message names the feature), or a URL parameter
/// neither dlock nor the client library knows (named); otherwise whatever
/// the driver's connect gives.
pub async fn connect(url: &str) -> Result<Locker> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::invalid_option(
            "url",
            // Not echoed: the URL may carry a password.
            "the URL has no scheme; expected e.g. redis://host:6379",
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => Ok(Locker::new(MemoryBackend::new())),
        "redis" | "rediss" | "redis+unix" | "redis+sentinel" | "redis+cluster" => {
            connect_redis(url).await
        }
        "mysql" | "mariadb" => connect_mysql(url).await,
        "postgres" | "postgresql" => connect_postgres(url).await,
        "zk" | "zookeeper" => connect_zk(url).await,
        "etcd" | "etcds" => connect_etcd(url).await,
        other => Err(Error::invalid_option(
            "url",
            format!(
                "unknown scheme `{other}`; expected redis, rediss, redis+unix, redis+sentinel, \
                 redis+cluster, mysql, mariadb, postgres, postgresql, zk, zookeeper, etcd, etcds \
                 or memory"
            ),
        )),
    }
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str) -> Result<Locker> {
    Ok(Locker::new(dlock_redis::RedisBackend::connect(url).await?))
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(_url: &str) -> Result<Locker> {
    Err(feature_off("redis", "redis"))
}

#[cfg(feature = "mysql")]
async fn connect_mysql(url: &str) -> Result<Locker> {
    Ok(Locker::new(dlock_mysql::MySqlBackend::connect(url).await?))
}

#[cfg(not(feature = "mysql"))]
async fn connect_mysql(_url: &str) -> Result<Locker> {
    Err(feature_off("mysql", "mysql"))
}

#[cfg(feature = "postgres")]
async fn connect_postgres(url: &str) -> Result<Locker> {
    dlock_postgres::PgBackend::builder(url)
        .connect_locker()
        .await
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(url: &str) -> Result<Locker> {
    let scheme = url.split_once("://").map_or("postgres", |(s, _)| s);
    Err(feature_off(scheme, "postgres"))
}

#[cfg(feature = "zookeeper")]
async fn connect_zk(url: &str) -> Result<Locker> {
    Ok(Locker::new(dlock_zk::ZkBackend::connect(url).await?))
}

#[cfg(not(feature = "zookeeper"))]
async fn connect_zk(_url: &str) -> Result<Locker> {
    Err(feature_off("zk", "zookeeper"))
}

#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str) -> Result<Locker> {
    Ok(Locker::new(dlock_etcd::EtcdBackend::connect(url).await?))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(url: &str) -> Result<Locker> {
    let scheme = url.split_once("://").map_or("etcd", |(s, _)| s);
    Err(feature_off(scheme, "etcd"))
}

#[allow(dead_code)] // unused when every driver is enabled
fn feature_off(scheme: &str, feature: &str) -> Error {
    Error::invalid_option(
        "url",
        format!(
            "`{scheme}://` needs the `{feature}` feature of dlock (the package `dlock-rs`): \
             features = [\"{feature}\"]"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_urls_connect() {
        let locker = connect("memory://").await.unwrap();
        let guard = locker
            .try_acquire("x", &LockOptions::new())
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }

    #[tokio::test]
    async fn unknown_and_missing_schemes_are_invalid() {
        for url in ["ftp://host", "no-scheme", "user:secret@host"] {
            let e = connect(url).await.unwrap_err();
            assert!(
                matches!(e, Error::InvalidOption { option: "url", .. }),
                "{e}"
            );
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }

    #[test]
    fn a_disabled_driver_names_its_feature() {
        let e = feature_off("zk", "zookeeper").to_string();
        assert!(e.contains("`zookeeper` feature"), "{e}");
    }
}
