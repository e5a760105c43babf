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
