//! The harness really starts each server from the test image and talks to it.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use dlock_conformance::harness::{Service, shared};
use zookeeper_client as zk;

#[tokio::test]
async fn redis_answers_ping() {
    let server = shared(Service::Redis).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn mariadb_answers_select() {
    use sqlx::Connection;
    let server = shared(Service::MariaDb).await;
    let mut conn = sqlx::MySqlConnection::connect(server.url()).await.unwrap();
    let (one, version): (i64, String) = sqlx::query_as("SELECT 1, VERSION()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert!(version.contains("MariaDB"), "{version}");
}

#[tokio::test]
async fn zookeeper_creates_and_deletes_a_znode() {
    let server = shared(Service::ZooKeeper).await;
    let client = zk::Client::connect(server.url()).await.unwrap();
    let path = format!("/smoke-{:x}", fastrand::u64(..));
    let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    client.create(&path, b"x", &opts).await.unwrap();
    let (data, _) = client.get_data(&path).await.unwrap();
    assert_eq!(data, b"x");
    client.delete(&path, None).await.unwrap();
    assert!(client.check_stat(&path).await.unwrap().is_none());
}

#[tokio::test]
async fn ports_are_bound_to_loopback_only() {
    let server = shared(Service::Redis).await;
    let container = server.container().expect("started by the harness");
    let ports = container.ports().await.unwrap();
    assert!(ports.map_to_host_port_ipv6(6379u16).is_none(), "{ports:?}");
    let port = server.port().unwrap();
    let out = std::process::Command::new("docker")
        .args(["port", container.id(), "6379/tcp"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(shown.trim(), format!("127.0.0.1:{port}"));
}
