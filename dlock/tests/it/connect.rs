//! `connect(url)` reaches each driver's real server.

#![cfg(all(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
#![allow(clippy::unwrap_used)] // tests panic on purpose

use dlock::LockOptions;
use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::unique_name;

async fn round_trip(url: &str) {
    let locker = dlock::connect(url).await.unwrap();
    let name = unique_name("connect");
    let guard = locker
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert!(
        locker
            .try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn redis_urls_pick_the_redis_driver() {
    round_trip(shared(Service::Redis).await.url()).await;
}

#[tokio::test]
async fn mysql_urls_pick_the_mysql_driver() {
    let url = shared(Service::MariaDb).await.url();
    dlock::mysql::MySqlBackend::connect(url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    round_trip(url).await;
    round_trip(&url.replacen("mysql://", "mariadb://", 1)).await;
}

#[tokio::test]
async fn postgres_urls_pick_the_postgres_driver() {
    let url = shared(Service::Postgres).await.url();
    round_trip(url).await;
    round_trip(&url.replacen("postgres://", "postgresql://", 1)).await;
}

#[tokio::test]
async fn zk_urls_pick_the_zookeeper_driver() {
    round_trip(&format!("zk://{}", shared(Service::ZooKeeper).await.url())).await;
}

#[tokio::test]
async fn etcd_urls_pick_the_etcd_driver() {
    round_trip(shared(Service::Etcd).await.url()).await;
}

/// `from_pool_test!(test, Service, Pool, Backend, refusal)`: a backend
/// built from an application's sqlx pool connects where the pool does,
/// with its credentials (a wrong password in the pool's options is refused
/// with `refusal`), on connections of its own: the lazy pool never opens
/// one.
macro_rules! from_pool_test {
    ($test:ident, $service:expr, $pool:ty, $backend:ty, $refusal:literal) => {
        #[tokio::test]
        async fn $test() {
            use dlock::Backend;
            let url = shared($service).await.url();
            let app_pool = <$pool>::connect_lazy(url).unwrap();
            let from_pool = <$backend>::builder_from_pool(&app_pool)
                .connect()
                .await
                .unwrap();
            let name = unique_name("from-pool");
            let lease = from_pool
                .try_acquire(&name, &LockOptions::new())
                .await
                .unwrap()
                .expect("a fresh name is free");
            let seen = <$backend>::connect(url)
                .await
                .unwrap()
                .inspect(&name)
                .await
                .unwrap();
            assert_eq!(seen.map(|i| i.owner), Some(lease.owner()));
            from_pool.release(&lease).await.unwrap();
            assert_eq!(
                app_pool.size(),
                0,
                "the backend borrowed the pool's connections"
            );
            let options = app_pool
                .connect_options()
                .as_ref()
                .clone()
                .password("wrong");
            let wrong = <$pool>::connect_lazy_with(options);
            match <$backend>::builder_from_pool(&wrong).connect().await {
                Err(e @ dlock::Error::Backend { .. }) => {
                    assert!(e.to_string().contains($refusal), "{e}");
                }
                other => panic!("the pool's wrong password: {other:?}"),
            }
        }
    };
}

from_pool_test!(
    postgres_builds_from_a_sqlx_pool_with_connections_of_its_own,
    Service::Postgres,
    sqlx::PgPool,
    dlock::postgres::PgBackend,
    "authentication failed"
);
from_pool_test!(
    mysql_builds_from_a_sqlx_pool_with_connections_of_its_own,
    Service::MariaDb,
    sqlx::MySqlPool,
    dlock::mysql::MySqlBackend,
    "access denied"
);
